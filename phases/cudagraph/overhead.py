"""Gate ``overhead``: what replaying captured steps saves where launches dominate, and costs
where they do not; and what a user's first request pays.

- Decode steps of one request through the kernel backend, eager against replayed from CUDA
  graphs, on the same model, pool and context: each engine holds its own request, and ``samples``
  rounds (7 by default) time ``steps`` CUDA-event-timed steps of each, the order alternating
  round by round, so a drift hits both sides of the ratio alike. Per round, from the median
  step times: ``replay_speedup_4k`` = eager / graph step time at 4k (short contexts: the step is
  launches), ``replay_slowdown_128k`` = graph / eager - 1 at 128k (long contexts must not pay for
  the graph); both are reported as samples, one per round (the runner judges a threshold on the
  interval of their median), the step times (``eager_step_ms_*``, ``graph_step_ms_*``) as the
  medians over the rounds.
- Capture: seconds and memory for the engine's buckets (``capture_s``, ``graph_memory_mib``).
- First request: ``python -m serving generate`` run twice in fresh processes sharing a new,
  empty Triton cache, as on a fresh machine: the first run compiles every kernel during its
  warm-up (``first_warmup_s``), and its decode tokens/s must match the second run's
  (``first_request_ratio`` = first / second decode tokens/s).

Gate: ``call: phases.cudagraph.overhead:run`` (CUDA).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from phases.common.engines import (
    SharedContext,
    capture_report,
    main_with_json_args,
    make_engine,
    metrics_table,
)
from phases.common.samples import SAMPLES, check_count, median, ratios, rounded
from phases.cudagraph.decode_speed import label, timed_rounds
from serving.device.select import pick_device
from serving.model.presets import random_model

try:
    from runner import gatekit
except ImportError:
    gatekit = None


def first_and_second_run(preset: str, prompt: int, new_tokens: int, speculate: str | None) -> dict:
    """Two ``serving generate`` processes on a new Triton cache: (warm-up s, decode tokens/s) each."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="triton-cold-") as cache:
        env = dict(os.environ, TRITON_CACHE_DIR=cache)
        cmd = [sys.executable, "-m", "serving", "generate", "--random-model", preset, "--random-prompt", str(prompt),
               "--max-new-tokens", str(new_tokens), "--json"] + (["--speculate", speculate] if speculate else [])
        for name in ("first", "second"):
            t0 = time.perf_counter()
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                raise RuntimeError(f"serving generate failed ({done.returncode}): {done.stderr[-2000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            out[f"{name}_warmup_s"] = result["warmup_s"]
            out[f"{name}_decode_tps"] = result["decode_tokens_per_s"]
            out[f"{name}_wall_s"] = time.perf_counter() - t0
    out["first_request_ratio"] = out["first_decode_tps"] / out["second_decode_tps"]
    return out


def run(
    contexts: list[int] = (4096, 131072),
    preset: str = "gpu-h16",
    warmup: int = 3,
    steps: int = 10,
    samples: int = SAMPLES,
    first_request: dict | None = None,
    device: str | None = None,
    seed: int = 0,
) -> dict:
    """Run the gate; returns its metrics (see the module docstring). ``steps``: timed steps per
    engine and round. ``first_request``: keyword arguments of ``first_and_second_run`` (None: 4k
    prompt, 64 new tokens, tree speculation); ``{}`` with ``skip=True`` skips it."""
    check_count(samples)
    dev = pick_device(device)
    model = random_model(preset, dev, torch.bfloat16 if dev.type == "cuda" else torch.float32, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    metrics: dict = {}
    for context in contexts:
        prefix = torch.randint(0, model.cfg.vocab_size, (context - 1,), generator=gen).tolist()
        # the shared prefix and both engines' requests, each growing a row per step
        pool = model.new_pool(3 * context + 2 * (warmup + samples * steps) + 4096, torch.bfloat16)
        shared = SharedContext(make_engine(model, pool, "reference", None), prefix)
        runs = {}
        for name, graphs in (("eager", False), ("graph", True)):
            engine = make_engine(model, pool, "kernel", None, cuda_graphs=graphs and dev.type == "cuda",
                                 graph_batch_sizes=(1,))
            if graphs and dev.type == "cuda":
                metrics["capture_s"] = capture_report(engine).seconds
                metrics["graph_memory_mib"] = capture_report(engine).total_bytes / 2**20
            req = shared.start(engine, [1], 10**9)
            engine.prefill(req)
            runs[name] = (engine, [req], False)  # attention shares are not this gate's
        rounds = timed_rounds(runs, warmup, steps, samples)
        for _, reqs, _ in runs.values():
            pool.release_request(reqs[0].req_id)
        del runs
        eager_s, graph_s = ([s for s, *_ in rounds[name]] for name in ("eager", "graph"))
        tag = label(context)
        metrics[f"eager_step_ms_{tag}"] = median(eager_s) * 1e3
        metrics[f"graph_step_ms_{tag}"] = median(graph_s) * 1e3
        metrics[f"replay_speedup_{tag}"] = ratios(eager_s, graph_s)
        metrics[f"replay_slowdown_{tag}"] = [r - 1 for r in ratios(graph_s, eager_s)]
        shared.release()
        print(json.dumps({k: rounded(v) for k, v in metrics.items() if k.endswith(tag)}), file=sys.stderr, flush=True)
        del pool, shared
    if first_request is None:
        first_request = dict(preset=preset, prompt=4096, new_tokens=64, speculate="tree:4x4:layers=1")
    if dev.type == "cuda" and not first_request.pop("skip", False):
        metrics.update(first_and_second_run(**first_request))
    if gatekit:
        gatekit.write_artifact("overhead.md", metrics_table(metrics))
    return metrics


def main() -> None:
    main_with_json_args(run, __doc__)


if __name__ == "__main__":
    main()
