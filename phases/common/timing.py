"""Step timing the serving gates share."""

from __future__ import annotations

import statistics

import torch

from serving.stack.profile import time_replay


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


def device_seconds(engine, reps: int = 20) -> float:
    """The device's part of a captured step: the last replayed step's graph replayed alone
    (``serving.stack.profile.time_replay``), median seconds. The step's time beyond it is the
    host's, with the device idle."""
    return statistics.median(time_replay(engine, reps))
