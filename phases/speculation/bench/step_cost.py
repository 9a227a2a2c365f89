"""Where a speculative step's time goes: plain decoding against the MTP chain and tree, at batch 1.

``python -m phases.speculation.bench.step_cost [--contexts 2048,16384] [--modes plain,mtp:1x3,mtp:1x3/serial,mtp:4x3]
[--steps 64] [--out FILE.json] [--device cuda] [--tiny]``

A mode is ``plain`` or an ``mtp:WxD`` spec; ``mtp:WxD/serial`` turns off the drafter's launch of
its chain step behind the verify step (``serving.speculation.chain_ahead``), so one run compares
the two (``proposals_ahead_share``: the share of steps whose drafts were launched ahead).

Per mode and context, on one engine per mode built as gate ``speculation`` builds its engines
(``serving.stack``, the kernel backend, CUDA graphs at the gate's batch sizes), after a warm-up
generation, one request of a random prompt of that context is prefilled and stepped:

1. wall: ``--steps`` engine steps timed by the engine (``StepStats.step_s``): ms per step
   (median and mean) and tokens emitted per step; graph replays per step (the runner's count).
2. device (CUDA): a torch.profiler trace of ``--profile-steps`` steps: kernels, memcpys and
   memsets per step, summed kernel µs, the device's busy µs (union of intervals), and each split
   by the graph replay it belongs to: ``draft`` (a step started and not read, ``try_launch``: the
   MTP chain's levels 2..D), ``verify`` (a step replayed and read, ``try_start``: plain's decode
   step too) or ``other`` (eager kernels and copies between them). Device work is matched to
   the host call that issued it by the profiler's correlation ids.
3. host: per step, the host µs before the first graph launch, between launches, after the last,
   the µs spent in launch calls and waiting for the device (stream / event / device syncs and
   copy calls, ``WAIT_CALLS``), from the same trace; and a cProfile of ``--profile-steps`` more
   steps: the top functions under ``Engine.step`` by cumulative µs per step.
   Per-step figures are reported per step (JSON) and as their median over the window.

Prints a Markdown table and writes everything as JSON to ``--out``.

Decisions:
- A seeded random model of the demo's shape (``serving/demo/train.py`` ``SIZES["default"]``:
  8 layers, hidden 768, 16 heads, q LoRA 384, 576-wide latent rows, vocab 8192, dense MLPs,
  rope ``default``) with an MTP module, no training: a step's kernels, shapes and launches do not
  depend on the weights. Random drafts are mostly rejected, so tokens per step sits near 1 and
  tokens/s here says nothing about speculation's payoff; the cost of a step does not move with
  acceptance (the verify step runs its full tree and the draft step its full chain either way),
  except the slot bookkeeping of accepted cells, a few host µs.
- One request from a fresh prefill per context, driven by ``Engine.step`` directly so every mode
  runs exactly ``--steps`` measured steps (a generation counts tokens, and speculative steps
  emit a varying number); the context grows by the emitted tokens during the run (at most
  ``steps x (depth + 1)``, well under the contexts measured).
- Three passes over fresh steps of the same request, each alone: untraced wall, the
  torch.profiler trace, cProfile. A tracer slows the host, so the wall figures come from the
  untraced pass; the trace's host split is proportionally inflated and is for where the host
  time goes, not how much there is; its device figures are not slowed.
- Attribution: during the traced pass only, the probe wraps the graph runner's ``try_launch`` /
  ``try_start`` (attributes of this process's engine object, removed after; no serving code
  changes) and each ``Engine.step`` in ``torch.profiler.record_function`` ranges; a device event
  belongs to the step and range whose host interval holds the runtime or driver call that
  issued it (so the result read's copy counts as ``verify``).
- On a CPU (``--device cpu``): no kernels and no graphs to launch; the engine is built with
  ``cuda_graphs`` and ``capture_graphs=False`` at batch sizes 1 and 4 (``CPU_BATCH_SIZES``), so
  the same replay path runs with an eager forward where the replay would be (the graph runner's
  CPU mode), and the host
  split is measured against those replay ranges instead of ``cudaGraphLaunch`` calls. Its
  numbers say nothing about a GPU; the CPU run checks the tool.
- Not measured: prefill, batch sizes above 1, sampled steps, the attention's own share
  (``python -m serving profile`` has it for plain decoding).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import pstats
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
GATE_BATCH_SIZES = (1, 2, 4, 8, 16, 32)  # gate ``speculation``'s at its batch sizes (1, 8)
CPU_BATCH_SIZES = (1, 4)  # every batch-1 step of the default modes (mtp:4x3's draft step is 4 chains)
DEFAULT_MODES = ("plain", "mtp:1x3", "mtp:1x3/serial", "mtp:4x3")
SERIAL = "/serial"  # a mode suffix: the MTP drafter proposes after the verify step's read (no launch ahead)

# serving/demo/train.py's model_config(SIZES["default"]) as random-preset overrides; all dense
# (its first_k_dense_replace covers every block, the MTP module's too).
DEMO_SHAPE = dict(vocab_size=8192, hidden_size=768, intermediate_size=3072, num_hidden_layers=8, num_attention_heads=16,
                  kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=64, v_head_dim=64, q_lora_rank=384,
                  n_routed_experts=None, first_k_dense_replace=9, max_position_embeddings=32768,
                  rope_parameters=dict(rope_type="default", rope_theta=10000.0), num_nextn_predict_layers=1)
# The same at SIZES["tiny"] (48-wide latent rows), for the CPU.
TINY_SHAPE = dict(DEMO_SHAPE, vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=2, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16,
                  q_lora_rank=32, first_k_dense_replace=3, max_position_embeddings=2048)

# Host calls that wait for the device: syncs, and copies (a device-to-host copy into pageable memory,
# as ``Tensor.cpu()`` makes, blocks inside cudaMemcpyAsync; copies from pinned memory return at once).
WAIT_CALLS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "cudaMemcpy2D",
              "cudaMemcpyAsync")
GRAPH_LAUNCH = "cudaGraphLaunch"
STEP_RANGE, DRAFT_RANGE, VERIFY_RANGE = "step_cost.step", "step_cost.draft", "step_cost.verify"
EAGER_MARK = "step_cost.no_bucket"
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CALL_CATEGORIES = ("cuda_runtime", "cuda_driver")


# ---- model and engines ---------------------------------------------------------------------


def probe_model(device: torch.device, tiny: bool, seed: int = 0):
    """The demo's shape (or its tiny size) with random weights and an MTP module: bf16 on CUDA,
    float32 on the CPU (as the gate loads the trained one)."""
    from serving.model.presets import random_model

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return random_model("gpu-h16", device, dtype, seed, **(TINY_SHAPE if tiny else DEMO_SHAPE))


def probe_engine(model, spec: str | None, max_context: int, batch_sizes: tuple[int, ...]):
    """One engine as gate ``speculation`` builds it for batch 1 (pool for one request of
    ``max_context`` tokens); on a CPU the graph runner's CPU mode (no capture)."""
    from serving.stack import ServingConfig, build_engine

    cuda = model.device.type == "cuda"
    config = ServingConfig(backend="kernel", speculate=spec, pool_slots=max_context + 4096, max_requests=1,
                           max_context=max_context, eos_token_ids=(), cuda_graphs=True, capture_graphs=cuda,
                           graph_batch_sizes=batch_sizes)
    return build_engine(config, model).engine


def chain_depth(spec: str | None) -> int:
    """Drafts per chain of ``mtp:WxD`` (0 for plain)."""
    return 0 if spec is None else int(spec.removesuffix(SERIAL).rpartition("x")[2].partition(":")[0])


def mode_spec(mode: str) -> tuple[str | None, bool]:
    """(the ``--speculate`` spec of a mode, whether its drafter launches ahead): ``plain`` is
    (None, False); a ``/serial`` suffix turns the launch ahead off."""
    if mode == "plain":
        return None, False
    return mode.removesuffix(SERIAL), not mode.endswith(SERIAL)


# ---- the probe's ranges (no serving code changes) ------------------------------------------


@contextmanager
def bracketed_graph_calls(engine):
    """While open, this engine's ``try_launch`` / ``try_start`` (instance attributes, this process
    only; the class's methods come back on exit) run in profiler ranges, so a trace says which
    replay a launch and its kernels belong to; a call that finds no captured bucket (the runner
    then runs the step eagerly, outside the range) leaves an ``EAGER_MARK`` inside it."""
    graphs = engine.runner.graphs
    for name, label in (("try_launch", DRAFT_RANGE), ("try_start", VERIFY_RANGE)):
        original = getattr(graphs, name)

        def wrapped(step, *args, _original=original, _label=label, **kwargs):
            with torch.profiler.record_function(_label):
                result = _original(step, *args, **kwargs)
                if result is None and not kwargs.get("planned_on_device"):  # else nothing runs at all
                    with torch.profiler.record_function(EAGER_MARK):
                        pass
                return result

        setattr(graphs, name, wrapped)
    try:
        yield
    finally:
        del graphs.try_launch, graphs.try_start


def run_steps(engine, request, steps: int) -> list[float]:
    """``steps`` engine steps of ``request``, each in a profiler range: the engine's seconds per step."""
    times = []
    for _ in range(steps):
        before = engine.stats.step_s
        with torch.profiler.record_function(STEP_RANGE):
            engine.step([request])
        times.append(engine.stats.step_s - before)
    if request.finished:
        raise RuntimeError(f"Expected the request to outlast the measured steps, got it finished: {request.error}")
    return times


# ---- trace analysis ------------------------------------------------------------------------


@dataclass
class Span:
    """One trace event: name, category, start and end in µs, and its correlation id (or None)."""

    name: str
    cat: str
    start: float
    end: float
    correlation: int | None = None

    @property
    def dur(self) -> float:
        return self.end - self.start


def trace_spans(trace_path: str) -> list[Span]:
    """The complete events of a chrome trace exported by torch.profiler."""
    events = json.loads(Path(trace_path).read_text())["traceEvents"]
    out = []
    for ev in events:
        if ev.get("ph") != "X" or "dur" not in ev:
            continue
        start = float(ev["ts"])
        corr = (ev.get("args") or {}).get("correlation")
        out.append(Span(ev.get("name", ""), ev.get("cat", ""), start, start + float(ev["dur"]), corr))
    return out


def union_us(spans: list[Span]) -> float:
    """µs covered by at least one of ``spans``."""
    total, end = 0.0, -math.inf
    for s in sorted(spans, key=lambda s: s.start):
        if s.start >= end:
            total, end = total + s.dur, s.end
        elif s.end > end:
            total, end = total + s.end - end, s.end
    return total


def overlap_us(spans: list[Span], start: float, end: float) -> float:
    """µs of ``spans`` (disjoint host calls) inside [start, end]."""
    return sum(max(0.0, min(s.end, end) - max(s.start, start)) for s in spans)


def within(span: Span, outer: Span) -> bool:
    return outer.start <= span.start and span.end <= outer.end + 1e-3


def enclosing(span: Span, ranges: list[Span]) -> Span | None:
    return next((r for r in ranges if within(span, r)), None)


def step_host_split(step: Span, launches: list[Span], waits: list[Span]) -> dict:
    """Host µs of one step around its launches: before the first, between them, after the last,
    in the launch calls, and waiting (sync calls) in each stretch. ``launches`` sorted by start."""
    if not launches:
        return {"host_step_us": step.dur, "host_wait_us": overlap_us(waits, step.start, step.end)}
    gaps = [(a.end, b.start) for a, b in zip(launches, launches[1:])]
    return {
        "host_step_us": step.dur,
        "host_before_first_launch_us": launches[0].start - step.start,
        "host_between_launches_us": sum(max(0.0, b - a) for a, b in gaps),
        "host_after_last_launch_us": step.end - launches[-1].end,
        "host_in_launch_calls_us": sum(s.dur for s in launches),
        "host_wait_us": overlap_us(waits, step.start, step.end),
        "host_wait_before_first_launch_us": overlap_us(waits, step.start, launches[0].start),
        "host_wait_between_launches_us": sum(overlap_us(waits, a, b) for a, b in gaps),
        "host_wait_after_last_launch_us": overlap_us(waits, launches[-1].end, step.end),
    }


def step_device_split(step: Span, device: list[Span], group_of: dict[int, str]) -> dict:
    """Device figures of one step: kernels, copies, summed kernel µs, busy µs, each in all and per
    group (``draft`` / ``verify`` / ``other``); ``group_of``: id(device span) -> its group."""
    out: dict = {}
    for group in ("all", "draft", "verify", "other"):
        mine = device if group == "all" else [d for d in device if group_of[id(d)] == group]
        kernels = [d for d in mine if d.cat == "kernel"]
        out[f"{group}_kernels"] = len(kernels)
        out[f"{group}_copies"] = len(mine) - len(kernels)
        out[f"{group}_kernel_us"] = sum(k.dur for k in kernels)
        out[f"{group}_busy_us"] = union_us(mine)
    if device:
        out["first_device_start_us"] = min(d.start for d in device) - step.start  # from the step's host start
        out["last_device_end_us"] = max(d.end for d in device) - step.start
    return out


def analyze_trace(spans: list[Span], cuda: bool) -> list[dict]:
    """Per traced step (in order): its graph launches by group, the host split and (CUDA) the
    device split. On a CPU the replay ranges stand in for launches."""
    steps = sorted((s for s in spans if s.name == STEP_RANGE and s.cat == "user_annotation"), key=lambda s: s.start)
    brackets = [s for s in spans if s.name in (DRAFT_RANGE, VERIFY_RANGE) and s.cat == "user_annotation"]
    eager = [s for s in spans if s.name == EAGER_MARK and s.cat == "user_annotation"]
    replayed = [b for b in brackets if not any(within(e, b) for e in eager)]  # the CPU's stand-in launches
    host_calls = [s for s in spans if s.cat in HOST_CALL_CATEGORIES]
    waits = [s for s in host_calls if s.name in WAIT_CALLS]
    graph_launches = [s for s in host_calls if s.name == GRAPH_LAUNCH] if cuda else replayed
    issuer = {s.correlation: s for s in host_calls if s.correlation is not None}
    device = [s for s in spans if s.cat in DEVICE_CATEGORIES] if cuda else []
    rows = []
    for step in steps:
        launches = sorted((g for g in graph_launches if within(g, step)), key=lambda g: g.start)
        group = {id(g): _group(g, brackets) for g in launches}
        row = {"graph_launches": len(launches),
               "draft_launches": sum(group[id(g)] == "draft" for g in launches),
               "verify_launches": sum(group[id(g)] == "verify" for g in launches),
               "no_bucket_calls": sum(within(e, step) for e in eager)}
        row.update(step_host_split(step, launches, [w for w in waits if within(w, step)]))
        if cuda:
            mine, group_of = [], {}
            for d in device:
                call = issuer.get(d.correlation)
                if call is not None and within(call, step):
                    mine.append(d)
                    group_of[id(d)] = _group(call, brackets)
            row.update(step_device_split(step, mine, group_of))
        rows.append(row)
    return rows


def _group(call: Span, brackets: list[Span]) -> str:
    """``draft`` / ``verify`` for a call inside a replay range, else ``other``."""
    outer = enclosing(call, brackets)
    if outer is None:
        return "other"
    return "draft" if outer.name == DRAFT_RANGE else "verify"


def trace_window(engine, request, steps: int, cuda: bool) -> tuple[list[dict], int]:
    """Per-step rows of ``analyze_trace`` for ``steps`` traced steps, and the trace's device events."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with bracketed_graph_calls(engine), profile(activities=activities) as prof:
        run_steps(engine, request, steps)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        spans = trace_spans(path)
    return analyze_trace(spans, cuda), sum(s.cat in DEVICE_CATEGORIES for s in spans)


# ---- cProfile ------------------------------------------------------------------------------


def cprofile_window(engine, request, steps: int, top: int = 25) -> list[dict]:
    """The ``top`` functions under ``Engine.step`` by cumulative time and the ``top`` by own time
    (where the host's time is spent, not only what calls it), by cumulative time: µs and calls per
    step. Each step is profiled on its own (``runcall``), so nothing of the probe's loop is counted."""
    profiler = cProfile.Profile()
    for _ in range(steps):
        profiler.runcall(engine.step, [request])
    if request.finished:
        raise RuntimeError(f"Expected the request to outlast the profiled steps, got it finished: {request.error}")
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (primitive calls, calls, own s, cumulative s, callers)
    rows = []
    for (file, line, name), (_, calls, own, cumulative, _) in stats.items():
        if file == __file__ or name == "<method 'disable' of '_lsprof.Profiler' objects>":
            continue
        rows.append({"function": _where(file, line, name), "cum_us_per_step": cumulative / steps * 1e6,
                     "own_us_per_step": own / steps * 1e6, "calls_per_step": calls / steps})
    by_own = {r["function"] for r in sorted(rows, key=lambda r: -r["own_us_per_step"])[:top]}
    rows.sort(key=lambda r: -r["cum_us_per_step"])
    return [r for k, r in enumerate(rows) if k < top or r["function"] in by_own]


def _where(file: str, line: int, name: str) -> str:
    """``path:line(Class.name)`` relative to the repository, or the built-in's name."""
    if file == "~":
        return name
    path = Path(file)
    short = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else f".../{path.parent.name}/{path.name}"
    return f"{short}:{line}({_qualified(name, file, line)})"


def _qualified(name: str, file: str, line: int) -> str:
    """``Engine.step`` rather than ``step`` where the code object names its class."""
    return "Engine.step" if name == "step" and file.endswith(os.path.join("engine", "engine.py")) else name


# ---- one mode at one context ---------------------------------------------------------------


def median_of(rows: list[dict]) -> dict:
    """Per key, the median over steps (keys some steps lack are taken over those that have them)."""
    keys = sorted({k for r in rows for k in r})
    return {k: statistics.median([r[k] for r in rows if k in r]) for k in keys}


def random_prompt(context: int, vocab: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (context,), generator=gen).tolist()


def measure(engine, mode: str, context: int, steps: int, profile_steps: int, warmup_steps: int, seed: int) -> dict:
    """One mode at one context (see the module docstring): wall, trace and cProfile passes over one
    request prefilled from a random prompt of ``context`` tokens."""
    cuda = engine.model.device.type == "cuda"
    graphs = engine.runner.graphs
    spec = mode_spec(mode)[0]
    budget = (warmup_steps + steps + 2 * profile_steps + 1) * (chain_depth(spec) + 1) + 8  # never finishes mid-run
    request = engine.add_request(random_prompt(context, engine.model.cfg.vocab_size, seed), budget)
    engine.prefill(request)
    if request.error:
        raise RuntimeError(f"{mode} at {context}: {request.error}")
    run_steps(engine, request, warmup_steps)
    engine.stats = type(engine.stats)()
    replays, eager = graphs.replays, graphs.eager_steps
    drafter = engine.drafter
    ahead_before = getattr(drafter, "proposals_ahead", 0)
    times = run_steps(engine, request, steps)
    s = engine.stats
    row = {"mode": mode, "context": context, "steps": steps,
           "wall_ms_per_step": s.step_s / s.steps * 1e3, "wall_ms_median": statistics.median(times) * 1e3,
           "wall_ms_p10": _quantile(times, 0.1) * 1e3, "wall_ms_p90": _quantile(times, 0.9) * 1e3,
           "tokens_per_step": s.emitted / s.steps, "tokens_per_s": s.tokens_per_s,
           "graph_replays_per_step": (graphs.replays - replays) / steps, "eager_steps": graphs.eager_steps - eager,
           "proposals_ahead_share": (getattr(drafter, "proposals_ahead", 0) - ahead_before) / steps}
    per_step, device_events = trace_window(engine, request, profile_steps, cuda)
    row["trace"] = {"steps": len(per_step), "device_events": device_events, "median": median_of(per_step),
                    "per_step": per_step}
    row["cprofile"] = cprofile_window(engine, request, profile_steps)
    engine.pool.release_request(request.req_id)
    return row


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---- the run -------------------------------------------------------------------------------


def run(contexts=(2048, 16384), modes=DEFAULT_MODES, steps: int = 64, profile_steps: int = 16, warmup_steps: int = 8,
        device: str | None = None, tiny: bool = False, batch_sizes: tuple[int, ...] | None = None, seed: int = 0,
        settle_tokens: int = 8, log=print) -> dict:
    """Every mode at every context; returns the JSON document (``rows``: one per mode and context)."""
    from serving.device.select import resolve_device

    dev = resolve_device(device)
    cuda = dev.type == "cuda"
    batch_sizes = tuple(batch_sizes or (GATE_BATCH_SIZES if cuda else CPU_BATCH_SIZES))
    model = probe_model(dev, tiny, seed)
    depth = max(chain_depth(mode_spec(m)[0]) for m in modes)
    max_context = max(contexts) + (warmup_steps + steps + 2 * profile_steps) * (depth + 1) + 128
    doc = {"device": torch.cuda.get_device_name(dev) if cuda else "cpu", "torch": torch.__version__,
           "shape": "tiny" if tiny else "demo", "config": TINY_SHAPE if tiny else DEMO_SHAPE,
           "graph_batch_sizes": list(batch_sizes), "steps": steps, "profile_steps": profile_steps,
           "warmup_steps": warmup_steps, "rows": []}
    for mode in modes:
        spec, ahead = mode_spec(mode)
        t0 = time.perf_counter()
        engine = probe_engine(model, spec, max_context, batch_sizes)
        if engine.drafter is not None and hasattr(engine.drafter, "ahead"):
            engine.drafter.ahead = ahead
        engine.generate([random_prompt(64, model.cfg.vocab_size, seed + 99)], settle_tokens)  # settle every kernel
        log(f"{mode}: engine ready in {time.perf_counter() - t0:.1f} s")
        for i, context in enumerate(contexts):
            row = measure(engine, mode, context, steps, profile_steps, warmup_steps, seed + 1 + i)
            log(f"{mode} at {context}: {row['wall_ms_median']:.3f} ms per step, {row['tokens_per_step']:.2f} tokens per step")
            doc["rows"].append(row)
        del engine
    doc["table"] = table(doc["rows"])
    return doc


TABLE_COLUMNS = (  # (header, key in the row or its trace medians, format)
    ("wall ms", "wall_ms_median", "{:.3f}"),
    ("× plain", "ratio_to_plain", "{:.2f}"),
    ("tok/step", "tokens_per_step", "{:.2f}"),
    ("launches", "graph_launches", "{:.0f}"),
    ("kernels", "all_kernels", "{:.0f}"),
    ("kernel µs", "all_kernel_us", "{:.0f}"),
    ("busy µs", "all_busy_us", "{:.0f}"),
    ("draft µs", "draft_busy_us", "{:.0f}"),
    ("verify µs", "verify_busy_us", "{:.0f}"),
    ("other µs", "other_busy_us", "{:.0f}"),
    ("host before", "host_before_first_launch_us", "{:.0f}"),
    ("between", "host_between_launches_us", "{:.0f}"),
    ("after", "host_after_last_launch_us", "{:.0f}"),
    ("wait", "host_wait_us", "{:.0f}"),
)


def table(rows: list[dict]) -> str:
    """Markdown: per mode and context, wall ms per step (median, untraced) and its ratio to
    plain's, then the traced medians (µs per step)."""
    plain = {r["context"]: r["wall_ms_median"] for r in rows if r["mode"] == "plain"}
    head = "| mode | context | " + " | ".join(h for h, _, _ in TABLE_COLUMNS) + " |"
    lines = [head, "|" + "---|" * (2 + len(TABLE_COLUMNS))]
    for r in rows:
        values = dict(r["trace"]["median"], **r)
        if r["context"] in plain:
            values["ratio_to_plain"] = r["wall_ms_median"] / plain[r["context"]]
        cells = [fmt.format(values[k]) if k in values else "-" for _, k, fmt in TABLE_COLUMNS]
        lines.append(f"| {r['mode']} | {r['context']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def cprofile_tables(rows: list[dict], top: int = 8) -> str:
    """Markdown: each row's top functions by cumulative µs per step."""
    out = []
    for r in rows:
        out.append(f"\n{r['mode']} at {r['context']} (cProfile, µs per step, cumulative / own / calls):\n")
        out += [f"- {f['cum_us_per_step']:.0f} / {f['own_us_per_step']:.0f} / {f['calls_per_step']:.1f}  {f['function']}"
                for f in r["cprofile"][:top]]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", default="2048,16384", help="prompt lengths, comma-separated")
    p.add_argument("--modes", default=",".join(DEFAULT_MODES), help="plain and/or mtp:WxD specs, comma-separated")
    p.add_argument("--steps", type=int, default=64, help="measured engine steps per mode and context (wall)")
    p.add_argument("--profile-steps", type=int, default=None, help="steps traced and cProfiled (default min(steps, 16))")
    p.add_argument("--warmup-steps", type=int, default=8, help="steps after each prefill, not measured")
    p.add_argument("--settle-tokens", type=int, default=8, help="tokens of each engine's warm-up generation")
    p.add_argument("--graph-batch-sizes", default=None, help="captured batch sizes (default the gate's: 1,2,4,8,16,32)")
    p.add_argument("--device", default=None, help="cuda (default when there is one) or cpu")
    p.add_argument("--tiny", action="store_true", help="the demo's tiny size (CPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the JSON document here")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"Expected --steps >= 1, got {args.steps}")
    if (args.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cpu"):
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are first imported, below
    sizes = tuple(int(b) for b in args.graph_batch_sizes.split(",")) if args.graph_batch_sizes else None
    doc = run([int(c) for c in args.contexts.split(",")], args.modes.split(","), args.steps,
              args.profile_steps or min(args.steps, 16), args.warmup_steps, args.device, args.tiny, sizes, args.seed,
              args.settle_tokens)
    print("\n" + doc["table"] + cprofile_tables(doc["rows"]))
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
