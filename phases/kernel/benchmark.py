"""Benchmark gate: kernel time as a fraction of the roofline, and speedup over the naive oracle.

Every row: B=1 (or a ragged B=8 batch, or a batched T=1 decode row), bf16, D=576, DV=512,
slots from ``torch.randperm`` of a fresh pool 1.25x the rows needed (past the 50 MB L2), a
random draft tree. The kernel is timed with ``triton.testing.do_bench`` (median, L2 flushed
between reps) into a preallocated ``out``, after its output has been checked against the fp32
oracle. Ceilings are measured first, in the same process. Rows are classed by packed rows
``H*T``: memory-bound (<= 64), compute-bound (>= 256), mid otherwise. The decode rows
(``phases.kernel.bench.shapes.DECODE_*``) are reported, not thresholded.

Four times per row: ``time_us`` (and so ``frac``) is the planned call a serving engine makes
per layer, ``MLAVerifyWrapper.plan()`` once outside the timing and ``run(out=)`` captured in a
CUDA graph whose replay is timed (device time, as an engine under graph capture pays it);
``eager_us`` is the same planned ``run`` launched eagerly (plus host launch cost); ``call_us``
is the one-call ``mla_verify_attention`` run eagerly with device indptrs (host planning and the
one read-back included), ``call_host_us`` the same with host (CPU) indptrs, as FlashInfer's
``plan`` takes them (no sync). ``max_eager_gap_us_b1`` / ``max_call_gap_us_b1`` are the largest
``eager_us - time_us`` and ``call_host_us - time_us`` over the B=1 sweep rows (the host-cost
targets: within 10 and 30 µs). ``fixed_cost.md`` fits ``t = a + bytes / BW`` per (H, T) over
the sweep's contexts, grouped by class.
All three use the default dispatch (``backend="auto"``): the Hopper path on an sm_90 GPU with
Gluon, the Triton path elsewhere; each row records the path its planned call used (``path``).

Artifacts (through ``runner.gatekit``): ``bench.json``, ``bench.md`` and two plots,
``roofline-fraction`` (fraction vs context per (H, T)) and ``kv-bandwidth`` (KV bandwidth vs
context, the naive oracle as reference series).

Gate: ``call: phases.kernel.benchmark:run``.
Standalone: ``python -m phases.kernel.benchmark [--quick] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from runner import gatekit

from kernel.reference import mla_verify_reference
from phases.kernel.bench.cases import PRODUCTION_SM_SCALE, Case, build_inputs
from phases.kernel.bench.fit import fit_fixed_cost, fit_table
from phases.kernel.bench.roofline import Ceilings, measure_ceilings, mla_verify_bytes, mla_verify_flops, roofline_time
from phases.kernel.bench.shapes import (
    BATCH8_CONTEXTS,
    BATCH8_SHAPE,
    BENCH_SHAPES,
    COMPARISON_CONTEXT,
    DEFAULT_CONTEXTS,
    HEAD_DIM,
    LAYOUT_COMPARISON_SHAPE,
    QUICK_CONTEXTS,
    TREE_COMPARISON_SHAPE,
    V_HEAD_DIM,
    decode_batch_shapes,
)
from phases.kernel.bench.timing import bench_us, graph_replay, planned_run
from phases.kernel.verify import max_request_rel_err

ORACLE_MIN_CONTEXT = 16384
ORACLE_MAX_BYTES = 20 << 30
MEMORY_BOUND_MAX_ROWS = 64
COMPUTE_BOUND_MIN_ROWS = 256


@dataclass
class BenchRow:
    """One timed configuration. Times in microseconds; ``oracle_us``/``speedup`` None when not timed."""

    name: str
    kind: str  # "sweep" | "batch" | "decode" | "tree" | "causal" | "scattered" | "contiguous"
    context: int  # L (the largest L_b for a batch)
    num_heads: int
    num_draft: int
    batch_size: int
    total_kv: int
    time_us: float  # planned run, CUDA-graph replay (eager where no graph can be captured)
    eager_us: float  # planned run, launched eagerly
    call_us: float  # one-call API, eagerly, device indptrs (host planning and one read-back included)
    kv_GBps: float
    tflops: float
    roofline_us: float
    frac: float
    bound: str
    oracle_us: float | None
    speedup: float | None
    rel_err: float
    path: str = "n/a"  # the kernel path the planned call dispatched to: "hopper" | "triton" ("n/a": not planned)
    call_host_us: float | None = None  # one-call API, eagerly, host (CPU) indptrs


@dataclass(frozen=True)
class BenchSpec:
    """What to time: the (H, T) sweep over contexts, the ragged batch, the (B, H, L) decode rows
    and the two comparisons."""

    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    shapes: tuple[tuple[int, int], ...] = BENCH_SHAPES
    batch_contexts: tuple[int, ...] = BATCH8_CONTEXTS
    decode_shapes: tuple[tuple[int, int, int], ...] = tuple(decode_batch_shapes())
    comparison_context: int = COMPARISON_CONTEXT
    oracle_min_context: int = ORACLE_MIN_CONTEXT
    oracle_max_context: int | None = None  # None: no upper bound (the ~20 GB cap still applies)
    seed: int = 0


def run(
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    seed: int = 0,
    oracle_max_context: int | None = None,
    artifacts_dir: str | None = None,
) -> dict:
    """Measure ceilings, then every row; return the gate's metrics.

    Args:
        contexts: L values of the (H, T) sweep.
        seed: input seed.
        oracle_max_context: time the oracle only up to this context (None: no upper bound;
            it is always skipped below 16k and above ~20 GB of temporaries).
        artifacts_dir: where ``bench.json``, ``bench.md`` and the plots go (None: the runner's
            artifacts through ``runner.gatekit``, nothing outside the runner).
    Returns:
        metrics: ``copy_bw_TBps``, ``bf16_TFLOPs``, ``min_frac_{memory,mid,compute}_{64k,16k}``,
        ``min_frac_batch8``, ``min_speedup_64k``, ``tree_mask_overhead``, ``scattered_overhead``,
        ``max_rel_err``, ``rows``, ``rows_hopper`` / ``rows_triton`` (rows whose planned call the
        default dispatch sent to each kernel path; each row's ``path`` is in bench.json and the
        table), ``elapsed_s`` and ``frac_<row>``/``us_<row>`` per row (e.g.
        ``frac_h16_t8_128k``). A class metric is absent when no row of it ran.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("The benchmark gate needs a CUDA GPU (torch.cuda.is_available() is False)")
    from kernel import mla_verify_attention

    device = torch.device("cuda")
    started = time.perf_counter()
    ceilings = measure_ceilings(device)
    spec = BenchSpec(contexts=tuple(contexts), oracle_max_context=oracle_max_context, seed=seed)
    rows = measure_rows(spec, mla_verify_attention, ceilings, device, prepare_run=eager_planned_run)
    metrics = summarize(rows, ceilings)
    device_info = describe_device(device)
    table = markdown_table(rows, ceilings, device_info)
    write_artifacts(None if artifacts_dir is None else Path(artifacts_dir), rows, ceilings, device_info, metrics, table)
    metrics["elapsed_s"] = round(time.perf_counter() - started, 2)
    print(table, flush=True)  # the gate's log keeps the table
    return metrics


def measure_rows(
    spec: BenchSpec,
    attention_fn: Callable[..., torch.Tensor],
    ceilings: Ceilings,
    device: torch.device,
    time_fn: Callable[..., float] | None = None,
    prepare_run: Callable[[dict, torch.Tensor], Callable[[], torch.Tensor]] | None = None,
) -> list[BenchRow]:
    """Every row of ``spec``, in order: sweep, ragged batch, decode rows, tree vs causal,
    scattered vs contiguous.

    ``attention_fn``: the one-call API (checked against the oracle, and timed as ``call_us``).
    ``time_fn(fn, warmup_ms=, rep_ms=) -> microseconds`` defaults to ``do_bench``'s median.
    ``prepare_run(inputs, out) -> fn`` returns the zero-argument planned call, timed eagerly as
    ``eager_us`` and, on a GPU, replayed from a CUDA graph as ``time_us`` (None: the one-call
    API itself, so all three times are its time).
    """
    bench = _Bench(attention_fn, ceilings, device, spec, time_fn or bench_us, prepare_run)
    progress = _Progress(len(spec.contexts) * len(spec.shapes) + len(spec.decode_shapes) + 5)
    base_seed = spec.seed * 1000
    rows: list[BenchRow] = []
    for context in spec.contexts:
        for num_heads, num_draft in spec.shapes:
            case = _single_case(num_heads, num_draft, context, seed=base_seed + len(rows))
            rows.append(bench.measure(f"h{num_heads}_t{num_draft}_{context_label(context)}", "sweep", case))
            progress.step()
    batch_heads, batch_draft = BATCH8_SHAPE
    batch_case = Case(
        num_heads=batch_heads,
        draft_lens=(batch_draft,) * len(spec.batch_contexts),
        context_lens=tuple(spec.batch_contexts),
        sm_scale=PRODUCTION_SM_SCALE,
        seed=base_seed + 900,
    )
    rows.append(bench.measure(f"b{batch_case.batch_size}_h{batch_heads}_t{batch_draft}", "batch", batch_case))
    progress.step()
    for batch_size, num_heads, context in spec.decode_shapes:
        case = Case(num_heads=num_heads, draft_lens=(1,) * batch_size, context_lens=(context,) * batch_size,
                    sm_scale=PRODUCTION_SM_SCALE, seed=base_seed + len(rows))
        name = f"b{batch_size}_h{num_heads}_t1_{context_label(context)}"
        rows.append(bench.measure(name, "decode", case, oracle=False))
        progress.step()
    tree_case = _single_case(*TREE_COMPARISON_SHAPE, spec.comparison_context, seed=base_seed + 901)
    rows += bench.compare_tree_causal(tree_case)
    progress.step(2)
    layout_case = _single_case(*LAYOUT_COMPARISON_SHAPE, spec.comparison_context, seed=base_seed + 902)
    rows += bench.compare_layouts(layout_case)
    progress.step(2)
    return rows


class _Bench:
    """Times rows of one device and kernel against the same-run ceilings."""

    def __init__(
        self,
        attention_fn: Callable[..., torch.Tensor],
        ceilings: Ceilings,
        device: torch.device,
        spec: BenchSpec,
        time_fn: Callable[..., float],
        prepare_run: Callable[[dict, torch.Tensor], Callable[[], torch.Tensor]] | None,
    ) -> None:
        self.attention_fn = attention_fn
        self.ceilings = ceilings
        self.device = device
        self.spec = spec
        self.time_fn = time_fn
        self.prepare_run = prepare_run

    def measure(self, name: str, kind: str, case: Case, oracle: bool = True) -> BenchRow:
        """Check, then time one row on a fresh pool (and the oracle, if ``oracle`` and in range)."""
        inputs = build_inputs(case, self.device)
        out = _empty_out(inputs, case)
        planned = self._prepare(inputs, out)
        rel_err = self._check(inputs, out, planned)
        times = self._time_kernel(inputs, out, planned)
        oracle_us = self._time_oracle(case, inputs) if oracle else None
        return self._row(name, kind, case, times, oracle_us, rel_err, _path_of(planned))

    def compare_tree_causal(self, case: Case) -> list[BenchRow]:
        """The same inputs with the tree mask and with ``tree_mask=None``, timed alternately."""
        tree_inputs = build_inputs(case, self.device)
        causal_inputs = {**tree_inputs, "tree_mask": None}
        return self._pair(("tree", case, tree_inputs), ("causal", case, causal_inputs))

    def compare_layouts(self, case: Case) -> list[BenchRow]:
        """Scattered vs contiguous slots over the same pool data, timed alternately."""
        contiguous = Case(**{**asdict(case), "scattered": False})
        return self._pair(
            ("scattered", case, build_inputs(case, self.device)),
            ("contiguous", contiguous, build_inputs(contiguous, self.device)),
        )

    def _pair(self, *variants: tuple[str, Case, dict]) -> list[BenchRow]:
        """Time variants in two alternating rounds and keep each one's faster median (drift-fair)."""
        outs = [_empty_out(inputs, case) for _, case, inputs in variants]
        planned = [self._prepare(inputs, out) for (_, _, inputs), out in zip(variants, outs)]
        rel_errs = [self._check(v[2], out, run) for v, out, run in zip(variants, outs, planned)]
        best = [(float("inf"),) * 4] * len(variants)
        for _ in range(2):
            for i, ((_, _, inputs), out) in enumerate(zip(variants, outs)):
                times = self._time_kernel(inputs, out, planned[i])
                best[i] = tuple(min(b, t) for b, t in zip(best[i], times))
        rows = []
        for (label, case, _), times, rel_err, run in zip(variants, best, rel_errs, planned):
            base = f"h{case.num_heads}_t{case.draft_lens[0]}_{context_label(case.context_lens[0])}"
            rows.append(self._row(f"{base}_{label}", label, case, times, None, rel_err, _path_of(run)))
        return rows

    def _prepare(self, inputs: dict, out: torch.Tensor) -> tuple[Callable[[], object], ...] | None:
        """``(eager, replay)`` planned calls (replay is the eager call where no graph can be captured)."""
        if self.prepare_run is None:
            return None
        eager = self.prepare_run(inputs, out)
        return eager, graph_replay(eager) if out.is_cuda else eager

    def _time_kernel(
        self, inputs: dict, out: torch.Tensor, planned: tuple[Callable[[], object], ...] | None
    ) -> tuple[float, float, float, float]:
        """(time_us, eager_us, call_us, call_host_us): planned replay, planned eager call, one-call
        API with device indptrs, and with host indptrs."""
        call_us = self.time_fn(lambda: self.attention_fn(**inputs, out=out), warmup_ms=25, rep_ms=200)
        if planned is None:
            return call_us, call_us, call_us, call_us
        host = {**inputs, "qo_indptr": inputs["qo_indptr"].cpu(), "kv_indptr": inputs["kv_indptr"].cpu()}
        call_host_us = self.time_fn(lambda: self.attention_fn(**host, out=out), warmup_ms=25, rep_ms=200)
        eager, replay = planned
        eager_us = self.time_fn(eager, warmup_ms=25, rep_ms=200)
        time_us = eager_us if replay is eager else self.time_fn(replay, warmup_ms=25, rep_ms=200)
        return time_us, eager_us, call_us, call_host_us

    def _check(self, inputs: dict, out: torch.Tensor, planned: tuple[Callable[[], object], ...] | None) -> float:
        """Largest per-request relative error vs the fp32 oracle, over the one-call API and the
        planned calls (each into a NaN-poisoned ``out``); inf when any leaves NaN/inf."""
        oracle = mla_verify_reference(**inputs, compute_dtype=torch.float32, out_dtype=torch.float32)
        worst = 0.0
        for call in (lambda: self.attention_fn(**inputs, out=out), *(planned or ())):
            out.fill_(float("nan"))
            call()
            if not bool(torch.isfinite(out).all()):
                return float("inf")
            worst = max(worst, max_request_rel_err(out, oracle, inputs["qo_indptr"]))
        return worst

    def _time_oracle(self, case: Case, inputs: dict) -> float | None:
        context, limit = max(case.context_lens), self.spec.oracle_max_context
        if context < self.spec.oracle_min_context or (limit is not None and context > limit):
            return None
        if oracle_bytes(case) > ORACLE_MAX_BYTES:
            return None
        torch.cuda.empty_cache()
        fn = lambda: mla_verify_reference(  # noqa: E731 - the unchunked naive baseline
            **inputs, compute_dtype=torch.float32, chunk_bytes=ORACLE_MAX_BYTES
        )
        return self.time_fn(fn, warmup_ms=10, rep_ms=60)

    def _row(
        self,
        name: str,
        kind: str,
        case: Case,
        times_us: tuple[float, ...],
        oracle_us: float | None,
        rel_err: float,
        path: str = "n/a",
    ) -> BenchRow:
        """A row from ``times_us = (time_us, eager_us, call_us[, call_host_us])``; roofline from the
        same-run ceilings."""
        time_us, eager_us, call_us = times_us[:3]
        call_host_us = times_us[3] if len(times_us) > 3 else None
        heads, drafts, contexts = case.num_heads, case.draft_lens, case.context_lens
        num_bytes = mla_verify_bytes(contexts, drafts, heads, HEAD_DIM, V_HEAD_DIM)
        flops = mla_verify_flops(contexts, drafts, heads, HEAD_DIM, V_HEAD_DIM)
        ideal_s = roofline_time(num_bytes, flops, self.ceilings)
        seconds = time_us * 1e-6
        return BenchRow(
            name=name,
            kind=kind,
            context=max(contexts),
            num_heads=heads,
            num_draft=drafts[0],
            batch_size=case.batch_size,
            total_kv=case.total_kv,
            time_us=round(time_us, 2),
            eager_us=round(eager_us, 2),
            call_us=round(call_us, 2),
            kv_GBps=round(case.total_kv * HEAD_DIM * 2 / seconds / 1e9, 1),
            tflops=round(flops / seconds / 1e12, 1),
            roofline_us=round(ideal_s * 1e6, 2),
            frac=round(ideal_s / seconds, 4),
            bound=bound_class(heads * drafts[0]),
            oracle_us=None if oracle_us is None else round(oracle_us, 1),
            speedup=None if oracle_us is None else round(oracle_us / time_us, 2),
            rel_err=rel_err,
            path=path,
            call_host_us=None if call_host_us is None else round(call_host_us, 2),
        )


def _path_of(planned: tuple[Callable[[], object], ...] | None) -> str:
    """The kernel path ("hopper" | "triton") the planned eager call last launched ("n/a" without one)."""
    wrapper = getattr(planned[0], "wrapper", None) if planned else None
    return getattr(wrapper, "last_path", None) or "n/a"


def summarize(rows: list[BenchRow], ceilings: Ceilings) -> dict:
    """The gate's metrics (see ``run``) from the measured rows."""
    metrics: dict = {
        "copy_bw_TBps": round(ceilings.copy_bw_bytes_per_s / 1e12, 3),
        "bf16_TFLOPs": round(ceilings.bf16_flops_per_s / 1e12, 1),
    }
    sweep = [r for r in rows if r.kind == "sweep"]
    for bound in ("memory", "mid", "compute"):
        of_class = [r for r in sweep if r.bound == bound]
        _put_min(metrics, f"min_frac_{bound}_64k", [r.frac for r in of_class if r.context >= 65536])
        _put_min(metrics, f"min_frac_{bound}_16k", [r.frac for r in of_class if r.context == 16384])
    _put_min(metrics, "min_frac_batch8", [r.frac for r in rows if r.kind == "batch"])
    long_sweep = [r for r in sweep if r.context >= 65536]
    _put_min(metrics, "min_speedup_64k", [r.speedup for r in long_sweep if r.speedup is not None])
    by_kind = {r.kind: r for r in rows}
    for metric, slower, baseline in (
        ("tree_mask_overhead", "tree", "causal"),
        ("scattered_overhead", "scattered", "contiguous"),
    ):
        if slower in by_kind and baseline in by_kind:
            metrics[metric] = round(by_kind[slower].time_us / by_kind[baseline].time_us - 1, 4)
    b1 = [r for r in sweep if r.batch_size == 1]
    _put_max(metrics, "max_eager_gap_us_b1", [r.eager_us - r.time_us for r in b1])
    _put_max(metrics, "max_call_gap_us_b1", [r.call_host_us - r.time_us for r in b1 if r.call_host_us is not None])
    metrics["max_rel_err"] = max(r.rel_err for r in rows)
    metrics["rows"] = len(rows)
    metrics["rows_hopper"] = sum(r.path == "hopper" for r in rows)
    metrics["rows_triton"] = sum(r.path == "triton" for r in rows)
    for r in rows:
        metrics[f"frac_{r.name}"] = r.frac
        metrics[f"us_{r.name}"] = r.time_us
    return metrics


def bound_class(packed_rows: int) -> str:
    """``memory`` for H*T <= 64, ``compute`` for H*T >= 256, ``mid`` in between."""
    if packed_rows <= MEMORY_BOUND_MAX_ROWS:
        return "memory"
    if packed_rows >= COMPUTE_BOUND_MIN_ROWS:
        return "compute"
    return "mid"


def context_label(context: int) -> str:
    """``65536 -> "64k"``; contexts that are not a multiple of 1024 keep their digits."""
    return f"{context // 1024}k" if context % 1024 == 0 else str(context)


def oracle_bytes(case: Case) -> int:
    """Peak temporaries of the unchunked fp32 oracle: gathered rows, then ~3 score-sized tensors."""
    rows = max(case.context_lens) * HEAD_DIM * (2 + 4)
    scores = max(t * ctx for t, ctx in zip(case.draft_lens, case.context_lens)) * case.num_heads * 4
    return rows + 3 * scores


def markdown_table(rows: list[BenchRow], ceilings: Ceilings, device_info: dict) -> str:
    """Ceilings and device on top, then one table line per row."""
    lines = [
        "# MLA verify benchmark",
        "",
        f"- device: {device_info.get('name')} ({device_info.get('sm_count')} SMs), "
        f"torch {device_info.get('torch')}, triton {device_info.get('triton')}",
        f"- copy bandwidth (D2D, read + written): {ceilings.copy_bw_bytes_per_s / 1e12:.3f} TB/s",
        f"- bf16 matmul 8192^3: {ceilings.bf16_flops_per_s / 1e12:.1f} TFLOP/s",
        "",
        "time_us: planned run replayed from a CUDA graph; eager_us: the same run launched eagerly; "
        "call_us / call_host_us: one-call mla_verify_attention, eagerly, with device / host indptrs "
        "(host planning included).",
        "",
        "| row | context | H | T | B | time_us | eager_us | call_us | call_host_us | kv_GBps | TFLOP/s | roofline_us | frac | bound "
        "| oracle_us | speedup | rel_err | path |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for r in rows:
        oracle = "n/a" if r.oracle_us is None else f"{r.oracle_us:.1f}"
        speedup = "n/a" if r.speedup is None else f"{r.speedup:.2f}"
        lines.append(
            f"| {r.name} | {context_label(r.context)} | {r.num_heads} | {r.num_draft} | {r.batch_size} | "
            f"{r.time_us:.1f} | {r.eager_us:.1f} | {r.call_us:.1f} | "
            f"{'n/a' if r.call_host_us is None else f'{r.call_host_us:.1f}'} | {r.kv_GBps:.0f} | {r.tflops:.1f} | {r.roofline_us:.1f} | {r.frac:.3f} | "
            f"{r.bound} | "
            f"{oracle} | {speedup} | {r.rel_err:.2e} | {r.path} |"
        )
    return "\n".join(lines) + "\n"


def describe_device(device: torch.device) -> dict:
    """GPU name, capability, SM count and library versions, for the report."""
    import triton

    props = torch.cuda.get_device_properties(device)
    return {
        "name": props.name,
        "capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "memory_GiB": round(props.total_memory / 2**30, 1),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "python": platform.python_version(),
    }


def write_artifacts(
    directory: Path | None, rows: list[BenchRow], ceilings: Ceilings, device_info: dict, metrics: dict, table: str
) -> None:
    """``bench.json`` (rows, ceilings, device, metrics), ``bench.md`` (the table) and the plots
    (see ``plots``): into ``directory``, or the runner's artifacts through ``runner.gatekit``
    when it is None (nothing outside the runner)."""
    payload = {
        "device": device_info,
        "ceilings": asdict(ceilings),
        "metrics": metrics,
        "rows": [asdict(r) for r in rows],
    }
    fits = fit_fixed_cost(rows)
    payload["fixed_cost"] = [asdict(f) for f in fits]
    files = {"bench.json": json.dumps(payload, indent=1), "bench.md": table,
             "fixed_cost.md": fit_table(fits, ceilings.copy_bw_bytes_per_s / 1e12)}
    figures = plots(rows)
    if directory is None:
        for name, text in files.items():
            gatekit.write_artifact(name, text)
        for name, figure in figures.items():
            gatekit.write_plot(name, figure["series"], title=figure["title"], x=figure["x"], y=figure["y"])
        return
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    for name, figure in figures.items():
        document = gatekit.plot_document(figure["series"], title=figure["title"], x=figure["x"], y=figure["y"])
        (directory / f"{name}.plot.json").write_text(json.dumps(document, indent=1) + "\n")


def plots(rows: list[BenchRow]) -> dict[str, dict]:
    """The report's figures from the sweep rows, in the ``runner.plot/1`` terms of ``runner.gatekit``.

    ``roofline-fraction``: fraction of the roofline vs context, one series per (H, T).
    ``kv-bandwidth``: KV bytes read per second vs context per (H, T), with the naive oracle's
    (where it was timed) as reference series.
    """
    sweep = [r for r in rows if r.kind == "sweep"]
    shapes = list(dict.fromkeys((r.num_heads, r.num_draft) for r in sweep))
    context_axis = gatekit.Axis("context", unit="tokens", scale="log")
    fraction, bandwidth = [], []
    for heads, drafts in shapes:
        of_shape = sorted((r for r in sweep if (r.num_heads, r.num_draft) == (heads, drafts)), key=lambda r: r.context)
        label = f"H={heads} T={drafts}"
        fraction.append(gatekit.Series(label, [(r.context, r.frac) for r in of_shape]))
        bandwidth.append(gatekit.Series(label, [(r.context, r.kv_GBps) for r in of_shape]))
        oracle = [(r.context, r.total_kv * HEAD_DIM * 2 / (r.oracle_us * 1e-6) / 1e9) for r in of_shape if r.oracle_us]
        if oracle:
            bandwidth.append(gatekit.Series(f"naive oracle {label}", oracle, reference=True))
    return {
        "roofline-fraction": dict(series=fraction, title="Fraction of the same-run roofline vs context (B=1)",
                                  x=context_axis, y=gatekit.Axis("fraction of roofline")),
        "kv-bandwidth": dict(series=bandwidth, title="KV bandwidth vs context (B=1), naive oracle dashed",
                             x=context_axis, y=gatekit.Axis("KV bandwidth", unit="GB/s", scale="log")),
    }


def _single_case(num_heads: int, num_draft: int, context: int, seed: int) -> Case:
    """B=1, bf16, D=576/DV=512, random tree, scattered int32 slots, production sm_scale."""
    return Case(
        num_heads=num_heads,
        draft_lens=(num_draft,),
        context_lens=(context,),
        sm_scale=PRODUCTION_SM_SCALE,
        seed=seed,
    )


def _empty_out(inputs: dict, case: Case) -> torch.Tensor:
    """``q.dtype`` ``[N, H, DV]``."""
    q = inputs["q"]
    return torch.empty(q.shape[0], q.shape[1], case.v_head_dim, dtype=q.dtype, device=q.device)


def _put_min(metrics: dict, name: str, values: list[float]) -> None:
    if values:
        metrics[name] = min(values)


def _put_max(metrics: dict, name: str, values: list[float]) -> None:
    if values:
        metrics[name] = round(max(values), 2)


class _Progress:
    """Counts finished rows and reports them through ``runner.gatekit.progress``."""

    def __init__(self, total: int) -> None:
        self.total, self.done = total, 0

    def step(self, count: int = 1) -> None:
        self.done += count
        gatekit.progress(self.done, self.total)


def eager_planned_run(inputs: dict, out: torch.Tensor) -> Callable[[], object]:
    """The planned call, eager (the benchmark captures and replays it itself)."""
    return planned_run(inputs, out, graph=False)


def main(argv: list[str] | None = None) -> int:
    """Command line: run the benchmark (which prints the table), then print the metrics."""
    parser = argparse.ArgumentParser(description="Benchmark mla_verify_attention against the roofline.")
    parser.add_argument("--quick", action="store_true", help="64k and 128k only; oracle at 64k only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="directory for bench.json, bench.md and the plots")
    args = parser.parse_args(argv)
    if args.quick:
        metrics = run(contexts=QUICK_CONTEXTS, seed=args.seed, oracle_max_context=65536, artifacts_dir=args.out)
    else:
        metrics = run(seed=args.seed, artifacts_dir=args.out)
    print(json.dumps(metrics, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
