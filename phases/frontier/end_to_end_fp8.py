"""Gate ``end-to-end-fp8``: FP8 decode against its own streaming limit, and against bf16 decode.

``dsv3-tp8-fp8`` (one TP=8 rank of DeepSeek-V3 with DeepSeek's block-FP8 projections: about 6.2
GB of weights read per step) and ``dsv3-tp8`` (the same rank in bf16, 10.97 GB), each served as a
user runs it (kernel backend, decode steps replayed from a CUDA graph captured at batch 1), B=1
at ``context`` tokens:

1. the copy bandwidth, before either model is drawn (``serving.stack.profile.copy_bandwidth``);
2. both models drawn, each with its own pool and one request whose ``context`` cached rows are
   random latents (decode cost does not depend on their values; prefill is ``end-to-end``'s);
3. ``warmup`` steps of each, then ``samples`` rounds, each timing ``steps`` engine steps of one
   model and then the other (the order alternating by round), so drift hits both alike;
4. per model, the captured graph replayed alone and a torch.profiler trace (kernels per step).

Metrics (``<side>``: ``fp8_64k``, ``bf16_64k`` at the default context):
``frac_streaming_limit_<side>``, the side's own streaming limit (its weight bytes, FP8 for FP8,
plus the latent rows, over the copy bandwidth) over its step time, one sample per round;
``fp8_speedup_<ctx>``, FP8's tokens/s over bf16's, one sample per round (the two sides of one
round); informative ``decode_tps_<side>``, ``step_ms_<side>``, ``replay_ms_<side>``,
``limit_ms_<side>``, ``kernels_per_step_<side>``, ``gpu_busy_share_<side>``, ``weight_GB_<side>``,
``copy_GBps``, ``leaked_slots``. Artifacts: the profiler's tables of both sides
(``end_to_end_fp8_profile.md``) and the metrics (``end_to_end_fp8.md``).

Decisions:
- Both models stay on the device for the whole run (about 30 GB with their pools at 64k), so
  the rounds interleave: a ratio of two runs made minutes apart would carry the clock's drift.
- FP8 is judged against its own limit (its FP8 bytes), not bf16's: the fraction says how well
  the FP8 GEMMs stream, the speed-up how much of FP8's smaller weights reaches the user.

Gate: ``call: phases.frontier.end_to_end_fp8:run`` (CUDA). CPU profile (tests):
``run(fp8_preset="tiny-fp8", bf16_preset="tiny", context=24, steps=2, samples=2, device="cpu")`` with
``TRITON_INTERPRET=1`` (the kernel backend in Triton's interpreter).
"""

from __future__ import annotations

import statistics
import sys

import torch

from phases.common.engines import main_with_json_args, make_engine, metrics_table
from phases.common.samples import SAMPLES, check_count, round_order
from phases.frontier.end_to_end import context_label, profile_report, row_metrics
from serving.device.select import DTYPES, pick_device
from serving.model.presets import random_model
from serving.stack import profile as step_profile

try:
    from runner import gatekit
except ImportError:
    gatekit = None


def run(
    fp8_preset: str = "dsv3-tp8-fp8",
    bf16_preset: str = "dsv3-tp8",
    context: int = 65536,
    warmup: int = 3,
    steps: int = 10,
    samples: int = SAMPLES,
    trace_steps: int = 5,
    replays: int = 10,
    copy_mib: int = step_profile.COPY_BYTES >> 20,
    dtype: str = "bf16",
    device: str | None = None,
    seed: int = 0,
) -> dict:
    """Run the gate; returns its metrics, the fractions and the speed-up as lists of ``samples``
    samples (see the module docstring)."""
    check_count(samples)
    if context < 2 or steps < 1 or warmup < 0:
        raise ValueError(f"Expected context >= 2, steps >= 1 and warmup >= 0, got {context}, {steps}, {warmup}")
    dev = pick_device(device)
    ctx = context_label(context)
    metrics: dict = {}
    copy_bw = step_profile.copy_bandwidth(dev, copy_mib << 20)  # before the models: their buffers need the room
    metrics["copy_GBps"] = copy_bw / 1e9
    growth = warmup + samples * steps + trace_steps
    gen = torch.Generator().manual_seed(seed)
    sides: dict[str, tuple] = {}  # name -> (engine, requests, cached rows when timing began, step bytes)
    for name, preset in (("fp8", fp8_preset), ("bf16", bf16_preset)):
        model = random_model(preset, dev, DTYPES[dtype], seed)
        pool = model.new_pool(context + growth + 64, DTYPES[dtype], max_requests=2, max_context=context + growth + 2)
        engine = make_engine(model, pool, "kernel", None, cuda_graphs=True, graph_batch_sizes=(1,),
                             capture_graphs=dev.type == "cuda")
        step_profile.randomize_pool(engine, seed)
        requests, _ = step_profile.start_requests(engine, 1, context, gen, prefill=False)
        for _ in range(warmup):
            engine.step(requests)
        cached = [engine.pool.table.length(r.req_id) for r in requests]
        sides[name] = (engine, requests, cached, step_profile.engine_step_bytes(engine, requests))
    rounds: dict[str, list[list[float]]] = {name: [] for name in sides}
    for r in range(samples):
        for name in round_order(list(sides), r):
            engine, requests, _, _ = sides[name]
            rounds[name].append(step_profile.time_steps(engine, requests, steps))
        if gatekit:
            gatekit.progress(r + 1, samples)
    rows = []
    for name, (engine, requests, cached, need) in sides.items():
        replay = step_profile.time_replay(engine, replays)
        kernels = step_profile.trace_steps(engine, requests, trace_steps)
        row = step_profile.decode_row(cached, need, rounds[name], replay, kernels, trace_steps, copy_bw,
                                      graphs=engine.runner.graphs is not None, tp_size=engine.model.tp.size)
        tag = f"{name}_{ctx}"
        metrics.update(row_metrics(row, tag))
        metrics[f"weight_GB_{tag}"] = row["weight_GB"]
        rows.append((tag, row))
        print(f"{tag}: {row['tokens_per_s']:.1f} tokens/s, {row['frac_streaming_limit']:.2f} of its limit",
              file=sys.stderr, flush=True)
    # tokens/s ratio of one round: bf16's median step over FP8's (B=1 on both sides)
    metrics[f"fp8_speedup_{ctx}"] = [statistics.median(b) / statistics.median(f)
                                     for f, b in zip(rounds["fp8"], rounds["bf16"])]
    leaked = 0
    for engine, requests, _, _ in sides.values():
        step_profile.release(engine, requests)
        leaked += engine.pool.leaked_slots()
    metrics["leaked_slots"] = leaked
    if gatekit:
        gatekit.write_artifact("end_to_end_fp8_profile.md",
                              profile_report(rows, "FP8 and bf16 decode steps against their streaming limits"))
        gatekit.write_artifact("end_to_end_fp8.md", metrics_table(metrics))
    return metrics


def main() -> None:
    main_with_json_args(run, __doc__)


if __name__ == "__main__":
    main()
