"""Where a replayed decode step's time goes: the device's share and the host's.

For one request (B=1) at each context, the engine as a user runs it (kernel backend, decode
steps replayed from a CUDA graph) beside the reference engine, over one pool:

- ``step_ms``: an engine step, CUDA events around ``Engine.step`` (what ``decode-speed`` times);
- ``replay_ms``: the step's captured graph replayed alone (its inputs already in place): the
  device's part of a step;
- ``host_ms`` = ``step_ms - replay_ms``: what the host adds (packing the step, planning the
  attention, reading the result back, the engine's bookkeeping), the device idle meanwhile;
- ``launch_us``: host time of ``graph.replay()`` itself, the device idle before it;
- ``kernels``: kernels in one replay (torch.profiler);
- ``ref_step_ms``: the reference engine's eager step; ``ratio`` = ``ref_step_ms / step_ms`` (as
  ``decode_speedup_*`` reads it) and ``ratio_device`` = ``ref_step_ms / replay_ms`` (what it
  would read with no host time).

Medians of ``steps`` timed steps after 5 warm-up steps; random weights and prompt.

    python -m phases.cudagraph.bench.step_split --out split.json   (H100: under a minute)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from phases.common.engines import SharedContext, make_engine
from phases.cudagraph.decode_speed import label
from serving.device.select import DTYPES
from serving.model.presets import random_model
from serving.stack.profile import time_replay, time_steps


def launch_us(graph: torch.cuda.CUDAGraph, n: int) -> float:
    """Median host microseconds of ``graph.replay()``, the device idle before each."""
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        times.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(times)


def kernels_per_replay(graph: torch.cuda.CUDAGraph) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if e.self_device_time_total > 0)


def split(preset: str, context: int, steps: int, seed: int = 0) -> dict:
    """One context's row (see the module docstring)."""
    device = torch.device("cuda")
    model = random_model(preset, device, DTYPES["bf16"], seed)
    pool = model.new_pool(3 * context + 8192, DTYPES["bf16"])
    gen = torch.Generator().manual_seed(seed + 1)
    builder = make_engine(model, pool, "reference", None, prefill_chunk=8192)
    shared = SharedContext(builder, torch.randint(0, model.cfg.vocab_size, (context - 1,), generator=gen).tolist())
    engine = make_engine(model, pool, "kernel", None, cuda_graphs=True, graph_batch_sizes=(1,), prefill_chunk=8192)
    reference = make_engine(model, pool, "reference", None, prefill_chunk=8192)
    requests = {}
    for name, eng in (("kernel", engine), ("reference", reference)):
        req = shared.start(eng, [1], 10**9)
        eng.prefill(req)
        requests[name] = req
        for _ in range(5):
            eng.step([req])
    graphs = engine.runner.graphs
    graph = graphs.graphs[graphs.last_key].graph
    row = {
        "step_ms": statistics.median(time_steps(engine, [requests["kernel"]], steps)) * 1e3,
        "replay_ms": statistics.median(time_replay(engine, steps)) * 1e3,
        "launch_us": launch_us(graph, steps),
        "kernels": kernels_per_replay(graph),
        "ref_step_ms": statistics.median(time_steps(reference, [requests["reference"]], steps)) * 1e3,
    }
    row["host_ms"] = row["step_ms"] - row["replay_ms"]
    row["ratio"] = row["ref_step_ms"] / row["step_ms"]
    row["ratio_device"] = row["ref_step_ms"] / row["replay_ms"]
    for req in requests.values():
        pool.release_request(req.req_id)
    shared.release()
    return {k: round(v, 3) for k, v in row.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="gpu-h16")
    parser.add_argument("--contexts", type=int, nargs="+", default=[4096, 131072])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", help="write the rows as JSON here too")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("step_split: needs a CUDA device")
    rows = {}
    for context in args.contexts:
        rows[f"{args.preset}_{label(context)}"] = split(args.preset, context, args.steps)
        torch.cuda.empty_cache()
        print(json.dumps({f"{args.preset}_{label(context)}": rows[f"{args.preset}_{label(context)}"]}), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
