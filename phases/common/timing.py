"""Step timing the serving gates share."""

from __future__ import annotations

import statistics

import torch


def attention_share(engine, step_s: float, reps: int = 20) -> float:
    """Attention's share of a captured step: a graph of the last replayed step's attention calls
    (same plan, pool and slots) timed against the step's ``step_s`` seconds."""
    graphs = engine.runner.graphs
    graph = graphs.attention_graph(graphs.last_key, engine.model.num_layers)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times) / step_s
