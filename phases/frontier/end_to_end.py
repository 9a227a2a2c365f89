"""Gate ``end-to-end``: decode against the hardware's streaming limit, and time to first token, on
the model the campaign serves (``dsv3-tp8``: 61 layers, one TP=8 rank of DeepSeek-V3, 10.97 GB
of weights read per step).

One run, one engine as a user runs it (kernel backend, decode steps replayed from CUDA graphs
captured at batch 1 and ``batch``), bf16:

1. the copy bandwidth: a device-to-device copy of ``copy_mib`` MiB (past the L2), median of
   several, measured before the model is drawn (``serving.stack.profile.copy_bandwidth``);
2. a short warm-up prefill (``warm_prompt`` tokens, released), so time to first token is a
   warm server's, as a user of a running engine gets it;
3. per context, ascending: a random prompt prefilled (``ttft_<ctx>_s``: its prefill, first token
   on the host), then plain decoding of that request, B=1; at ``batch_context`` also ``batch``
   requests, the prefilled one and ``batch - 1`` starting from copies of its rows;
4. per decode row: ``warmup`` steps, then ``samples`` rounds of ``steps`` engine steps timed by
   CUDA events, the captured graph replayed alone, and a torch.profiler trace of
   ``trace_steps`` steps (``serving.stack.profile.profile_decode``).

Metrics (``<tag>``: ``64k``, ``185k``, ``b8_64k``): ``frac_streaming_limit_<tag>``, the streaming
limit (the bytes a step must read: weights and every layer's latent rows of the context, over
the copy bandwidth) over the step time, one sample per round; ``ttft_<ctx>_s``; informative
``decode_tps_<tag>``, ``step_ms_<tag>``, ``replay_ms_<tag>``, ``limit_ms_<tag>``,
``kernels_per_step_<tag>``, ``gpu_busy_share_<tag>``, ``copy_GBps``, ``weight_GB``,
``leaked_slots``. Artifacts: the profiler's tables per row (``end_to_end_profile.md``) and the
metrics (``end_to_end.md``).

Decisions:
- Decode runs on the prefilled rows (the prefill is measured anyway), not on random ones.
- ``batch - 1`` requests copy the prefilled request's rows (a device copy) instead of
  prefilling the same prompt again: their prefill is not what the B=8 row measures.
- The fraction's samples share one bandwidth measurement: the copy needs 2 GiB that the
  model's pool takes later.
- Timing fits one 10-minute GPU command: on an H200 the 185k prefill alone took about 100 s
  (2026-12-02); capture, the 64k prefill and the decode rows a minute or two more.

Gate: ``call: phases.frontier.end_to_end:run`` (CUDA).
Standalone: ``python -m phases.frontier.end_to_end --args '{"contexts": [65536], "batch_context": 65536}'``.
"""

from __future__ import annotations

import json
import sys
import time

import torch

from phases.common.engines import main_with_json_args, make_engine, metrics_table
from phases.common.samples import SAMPLES, check_count, rounded
from phases.cudagraph.decode_speed import label
from serving.device.select import DTYPES, pick_device
from serving.model.presets import random_model
from serving.stack import profile as step_profile

try:
    from runner import gatekit
except ImportError:
    gatekit = None


def context_label(context: int) -> str:
    """``64k`` for 65536, ``185k`` for 189440 (``decode_speed.label``); a short test context as is."""
    return label(context) if context >= 1000 else str(context)


def tag(context: int, batch: int) -> str:
    """A row's metric suffix: ``64k`` for one request, ``b8_64k`` for a batch of 8."""
    return context_label(context) if batch == 1 else f"b{batch}_{context_label(context)}"


def row_metrics(row: dict, name: str) -> dict:
    """The gate's metrics of one profiled decode row (``serving.stack.profile.decode_row``)."""
    out = {
        f"frac_streaming_limit_{name}": row["frac_samples"],
        f"decode_tps_{name}": row["tokens_per_s"],
        f"step_ms_{name}": row["step_ms"],
        f"limit_ms_{name}": row["limit_ms"],
        f"kernels_per_step_{name}": row["kernels_per_step"],
        f"gpu_busy_share_{name}": row["busy_share"],
    }
    if row["replay_ms"] is not None:
        out[f"replay_ms_{name}"] = row["replay_ms"]
    return out


def pool_slots(contexts: list[int], batch: int, batch_context: int, growth: int, warm_prompt: int) -> int:
    """Slots for the largest set of live requests: one context's requests (released before the
    next), each with its rows and ``growth`` decoded ones, plus the warm-up prompt."""
    live = max((batch if c == batch_context else 1) * (c + growth + 2) for c in contexts)
    return live + warm_prompt + 64


def run(
    preset: str = "dsv3-tp8",
    contexts: list[int] = (65536, 189440),
    batch: int = 8,
    batch_context: int = 65536,
    warmup: int = 3,
    steps: int = 10,
    samples: int = SAMPLES,
    trace_steps: int = 5,
    replays: int = 10,
    prefill_chunk: int = 32768,
    warm_prompt: int = 4096,
    copy_mib: int = step_profile.COPY_BYTES >> 20,
    dtype: str = "bf16",
    device: str | None = None,
    seed: int = 0,
) -> dict:
    """Run the gate; returns its metrics, the fractions as lists of ``samples`` samples (see the
    module docstring)."""
    check_count(samples)
    contexts = sorted(int(c) for c in contexts)
    if batch_context not in contexts:
        raise ValueError(f"Expected batch_context among the contexts {contexts} (its prefill is shared), got {batch_context}")
    if len({context_label(c) for c in contexts}) < len(contexts):
        raise ValueError(f"Expected contexts whose metric names differ, got {contexts} "
                         f"(labels {[context_label(c) for c in contexts]})")
    if batch < 2 or min(contexts) < 2 or warm_prompt < 1:
        raise ValueError(f"Expected batch >= 2, contexts >= 2 and warm_prompt >= 1, got {batch}, {contexts}, {warm_prompt}")
    dev = pick_device(device)
    metrics: dict = {}
    copy_bw = step_profile.copy_bandwidth(dev, copy_mib << 20)  # before the model: its buffers need the room
    metrics["copy_GBps"] = copy_bw / 1e9
    model = random_model(preset, dev, DTYPES[dtype], seed)
    growth = warmup + samples * steps + trace_steps
    slots = pool_slots(contexts, batch, batch_context, growth, warm_prompt)
    pool = model.new_pool(slots, DTYPES[dtype], max_requests=batch + 1, max_context=max(contexts) + growth + 2)
    captured = dev.type == "cuda"  # on a CPU: the same static steps, not captured
    t0 = time.perf_counter()
    engine = make_engine(model, pool, "kernel", None, cuda_graphs=True, graph_batch_sizes=(1, batch), capture_graphs=captured,
                         prefill_chunk=prefill_chunk)
    metrics["capture_s"] = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(seed)
    warm, _ = step_profile.start_requests(engine, 1, warm_prompt, gen, prefill=True)
    step_profile.release(engine, warm)
    rows: list[tuple[str, dict]] = []
    total = len(contexts) + 1
    for context in contexts:
        width = batch if context == batch_context else 1
        requests, ttft = step_profile.start_requests(engine, width, context, gen, prefill=True)
        metrics[f"ttft_{context_label(context)}_s"] = ttft
        print(f"context {context}: time to first token {ttft:.1f} s", file=sys.stderr, flush=True)
        for group in ([requests[:1], requests] if width > 1 else [requests]):
            row = step_profile.profile_decode(engine, group, copy_bw, warmup=warmup, steps=steps, rounds=samples,
                                              trace=trace_steps, replays=replays)
            name = tag(context, len(group))
            metrics.update(row_metrics(row, name))
            metrics.setdefault("weight_GB", row["weight_GB"])
            rows.append((name, row))
            print(json.dumps({k: rounded(v) for k, v in row_metrics(row, name).items()}), file=sys.stderr, flush=True)
            if gatekit:
                gatekit.progress(len(rows), total)
        step_profile.release(engine, requests)
    metrics["leaked_slots"] = pool.leaked_slots()  # every request released: any slot still taken leaked
    if gatekit:
        gatekit.write_artifact("end_to_end_profile.md",
                              profile_report(rows, f"Decode steps of `{preset}` against the streaming limit"))
        gatekit.write_artifact("end_to_end.md", metrics_table(metrics))
    return metrics


def profile_report(rows: list[tuple[str, dict]], heading: str) -> str:
    """The profiler's tables of every decode row, as one Markdown document under ``heading``."""
    parts = [f"# {heading}\n"]
    for name, row in rows:
        parts.append(step_profile.markdown(row, title=f"{name}: B={row['batch']}, {row['context']} cached rows"))
        parts.append(step_profile.top_kernels_markdown(row))
    return "\n".join(parts)


def main() -> None:
    main_with_json_args(run, __doc__)


if __name__ == "__main__":
    main()
