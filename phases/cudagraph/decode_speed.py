"""Gate ``decode-speed``: decode and verify steps of the engine as a user runs it (kernel backend,
steps replayed from CUDA graphs) against the reference backend (eager: its shapes follow the
lengths, so it cannot be captured).

For each context length, one long request and a batch of 8 (all starting from copies of one
prefilled random context) run engine steps through both backends on the same model and pool:

- decode: plain greedy steps (T=1); decode tokens/s = requests / median step time;
- verify: steps with a fixed random ``width x depth`` draft tree per request (latency);
- attention's share of a step: for the reference backend its attention calls' CUDA-event time
  over the step's; for the kernel backend (inside a graph, where calls cannot be timed apart)
  a graph of only the step's attention calls (same plan, pool and slots), replayed and timed,
  over the step's time. ``*_eager`` metrics time the kernel backend's eager steps too.

Every step is timed with CUDA events. Decode is measured in ``samples`` rounds (7 by default): the
three engines (reference, kernel eager, kernel with graphs) each hold their own requests, and
every round times ``steps`` steps of each, the order alternating round by round, so a drift of
the host or the GPU hits every side of a ratio alike. The ratios, ``decode_speedup_*`` and
``attention_share_*``, are reported as samples (one per round: the runner judges a threshold on
the interval of their median); tokens/s and step times are the medians over the rounds. On
CUDA each round also replays the kernel step's graph alone: ``device_share_*`` (the device's
part of a replayed step; the rest is the host's, the device idle) and ``decode_speedup_device_*``
(the reference's step over that device part: the ratio with no host time), both informative,
one sample per round. Verify
steps are timed once per engine (median of ``steps`` after ``warmup``). The model is bf16 (pool
too), as served. Metrics are named by context (4096 -> ``4k``, 131072 -> ``128k``, 185000 ->
``185k``) with ``_b8`` for the batch of 8: ``decode_speedup_128k`` (kernel over reference
tokens/s, one request) and ``attention_share_128k`` (kernel backend, one request) are the ones
the plan checks.

Gate: ``call: phases.cudagraph.decode_speed:run`` (CUDA).
Standalone: ``python -m phases.cudagraph.decode_speed --args '{"contexts": [4096]}'``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from phases.common.engines import (
    SharedContext,
    main_with_json_args,
    make_engine,
    metrics_table,
)
from phases.common.samples import (
    SAMPLES,
    check_count,
    interleaved,
    median,
    ratios,
    rounded,
)
from phases.common.timing import attention_share, device_seconds
from serving.device.select import DTYPES, pick_device
from serving.model.presets import random_model
from serving.speculation.tree import DraftTree

try:
    from runner import gatekit
except ImportError:
    gatekit = None


class FixedTreeDrafter:
    """Drafts a fixed-shape tree (``width`` chains of ``depth``) of seeded random tokens."""

    def __init__(self, width: int, depth: int, vocab: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        paths = [torch.randint(0, vocab, (depth,), generator=gen).tolist() for _ in range(width)]
        self.tree = DraftTree.from_paths(paths)
        self.max_drafts = len(self.tree)
        self.fused_topk = 0  # no MTP module steps ride on the target's

    def draft_steps(self, num_layers: int) -> list:
        return []  # no device steps of its own

    def propose(self, ctx, requests):
        return [self.tree for _ in requests]


def label(context: int) -> str:
    return f"{context // 1024}k" if context % 1024 == 0 else f"{round(context / 1000)}k"


def time_steps(engine, requests, warmup: int, steps: int) -> tuple[float, float]:
    """Median step seconds and median attention share over ``steps`` timed steps."""
    times, shares = [], []
    cuda = engine.model.device.type == "cuda"
    for i in range(warmup + steps):
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        attention_before = engine.stats.attention_s
        engine.step(requests)
        if cuda:
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            seconds = time.perf_counter() - t0
        if i >= warmup:
            times.append(seconds)
            shares.append((engine.stats.attention_s - attention_before) / seconds)
    return statistics.median(times), statistics.median(shares)


# (metric name, attention backend, replayed from CUDA graphs): the engines a decode round times.
ENGINES = (("reference", "reference", False), ("kernel_eager", "kernel", False), ("kernel", "kernel", True))


def measure_round(engine, requests, steps: int, captured: bool) -> tuple[float, float, float | None]:
    """One round of ``steps`` timed steps: (median step seconds, attention's share of a step,
    the device's part of a step in seconds: captured steps only, else None)."""
    step_s, share = time_steps(engine, requests, 0, steps)
    if not captured:
        return step_s, share, None
    return step_s, attention_share(engine, step_s), device_seconds(engine)


def timed_rounds(runs: dict, warmup: int, steps: int, samples: int) -> dict[str, list[tuple[float, float, float | None]]]:
    """``runs``: name -> (engine, its requests, captured). Warm-up steps on every engine first,
    then ``samples`` interleaved rounds (``phases.common.samples.interleaved``); each engine's
    ``measure_round`` per round."""
    for engine, requests, _ in runs.values():
        for _ in range(warmup):
            engine.step(requests)
    measures = {name: (lambda e=engine, r=requests, c=captured: measure_round(e, r, steps, c))
                for name, (engine, requests, captured) in runs.items()}
    return interleaved(measures, samples)


def run(
    contexts: list[int] = (4096, 32768, 131072, 185000),
    batch_sizes: list[int] = (1, 8),
    preset: str = "gpu-h16",
    tree: str = "4x4",
    warmup: int = 3,
    steps: int = 10,
    samples: int = SAMPLES,
    dtype: str = "bf16",
    prefill_chunk: int = 8192,
    device: str | None = None,
    seed: int = 0,
) -> dict:
    """Run the benchmark; returns its metrics, the ratios as lists of ``samples`` samples (see the
    module docstring). ``steps``: timed steps per decode round and per verify measurement."""
    check_count(samples)
    dev = pick_device(device)
    model = random_model(preset, dev, DTYPES[dtype], seed)
    width, depth = (int(x) for x in tree.split("x"))
    drafter = FixedTreeDrafter(width, depth, model.cfg.vocab_size, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    metrics: dict = {}
    series: dict[str, list] = {}
    max_batch = max(batch_sizes)
    total = len(contexts) * len(batch_sizes)
    done = 0
    for context in contexts:
        prefix = torch.randint(0, model.cfg.vocab_size, (context - 1,), generator=gen).tolist()
        # Decode rounds hold every engine's requests at once; a verify step takes a tree's slots.
        growth = max(warmup + samples * steps, (warmup + steps) * (1 + len(drafter.tree)))
        slots = context + len(ENGINES) * max_batch * (context + 2 * growth + 64) + 1024
        pool = model.new_pool(slots, DTYPES[dtype])
        builder = make_engine(model, pool, "reference", None, prefill_chunk=prefill_chunk)
        t0 = time.perf_counter()
        shared = SharedContext(builder, prefix)
        metrics[f"prefill_s_{label(context)}"] = time.perf_counter() - t0
        print(f"context {context}: prefill {metrics[f'prefill_s_{label(context)}']:.1f} s", file=sys.stderr, flush=True)

        def start(engine, batch):
            reqs = [shared.start(engine, [int(torch.randint(0, model.cfg.vocab_size, (1,), generator=gen))], 10**9)
                    for _ in range(batch)]
            for r in reqs:
                engine.prefill(r)
            return reqs

        def engine_for(backend, graphs, batch, speculate):
            captured = graphs and dev.type == "cuda"  # on a CPU: the same static steps, not captured
            engine = make_engine(model, pool, backend, speculate, cuda_graphs=graphs, graph_batch_sizes=(batch,),
                                 capture_graphs=captured, prefill_chunk=prefill_chunk, profile=not captured)
            return engine, captured

        for batch in batch_sizes:
            tag = label(context) + ("" if batch == 1 else f"_b{batch}")
            runs = {}
            for name, backend, graphs in ENGINES:
                engine, captured = engine_for(backend, graphs, batch, None)
                runs[name] = (engine, start(engine, batch), captured)
            rounds = timed_rounds(runs, warmup, steps, samples)
            for engine, reqs, _ in runs.values():
                for r in reqs:
                    pool.release_request(r.req_id)
            del runs
            step_s = {name: [s for s, _, _ in rounds[name]] for name in rounds}
            for name in rounds:
                metrics[f"decode_tps_{name}_{tag}"] = batch / median(step_s[name])
                metrics[f"decode_step_ms_{name}_{tag}"] = median(step_s[name]) * 1e3
                share = f"attention_share_{tag}" if name == "kernel" else f"attention_share_{name}_{tag}"
                metrics[share] = [sh for _, sh, _ in rounds[name]]
            device_s = [d for _, _, d in rounds["kernel"]]
            if all(d is not None for d in device_s):  # captured (CUDA): what the host adds to a step
                metrics[f"device_share_{tag}"] = [d / s for d, s in zip(device_s, step_s["kernel"])]
                metrics[f"decode_speedup_device_{tag}"] = ratios(step_s["reference"], device_s)
            for name, backend, graphs in ENGINES:  # verify latency, one engine at a time
                engine, captured = engine_for(backend, graphs, batch, drafter)
                reqs = start(engine, batch)
                verify_s, _ = time_steps(engine, reqs, warmup, steps)
                for r in reqs:
                    pool.release_request(r.req_id)
                metrics[f"verify_step_ms_{name}_{tag}"] = verify_s * 1e3
                del engine
            # tokens/s over tokens/s of one round is the inverse ratio of its step times
            metrics[f"decode_speedup_{tag}"] = ratios(step_s["reference"], step_s["kernel"])
            metrics[f"decode_speedup_eager_{tag}"] = ratios(step_s["reference"], step_s["kernel_eager"])
            for name, _, _ in ENGINES:
                series.setdefault(f"{name}, batch {batch}", []).append((context, metrics[f"decode_tps_{name}_{tag}"]))
            done += 1
            print(json.dumps({k: rounded(v) for k, v in metrics.items() if k.endswith(tag)}), file=sys.stderr, flush=True)
            if gatekit:
                gatekit.progress(done, total)
        shared.release()
        metrics["leaked_slots"] = metrics.get("leaked_slots", 0) + pool.allocator.capacity - pool.allocator.num_free
        del pool, builder, shared
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if gatekit:
        gatekit.write_plot(
            "decode_tps",
            [gatekit.Series(name, pts, reference=name.startswith("reference")) for name, pts in series.items()],
            title=f"Decode tokens/s ({preset}, {dtype})",
            x=gatekit.Axis("context", unit="tokens", scale="log"),
            y=gatekit.Axis("decode throughput", unit="tokens/s", scale="log"),
        )
        gatekit.write_artifact("decode_speed.md", metrics_table(metrics))
    return metrics


def main() -> None:
    main_with_json_args(run, __doc__)


if __name__ == "__main__":
    main()
