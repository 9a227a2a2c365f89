"""Benchmark gate: kernel time as a fraction of the roofline, speedup over the naive oracle, and
what the tree mask and scattered slots cost.

The thresholds are the speedup over the oracle at 64k (at least 5x), the tree mask's cost over a
chain (at most 5%) and scattered slots' over contiguous ones (at most 10%); the roofline
fractions are targets (decisions of 2026-12-03 and 2026-12-06, in the plan). The comparison
against FlashMLA and FlashInfer is phase ``frontier``'s ``peers`` gate (``phases.frontier.peers``,
with ``phases.kernel.bench.peers``).

Every row: B=1 (or a ragged B=8 batch, or a batched T=1 decode row), bf16, D=576, DV=512,
slots from ``torch.randperm`` of a fresh pool (1.25x the rows needed, and at least
``2 * L2_BYTES / layers`` bytes, so the pools of one row's layers together are past twice the
50 MB L2), a random draft tree. Each row's output is checked against the fp32 oracle before it is
timed. Ceilings are measured first, in the same process. Rows are classed by packed rows
``H*T``: memory-bound (<= 64), compute-bound (>= 256), mid otherwise. The decode rows
(``phases.kernel.bench.shapes.DECODE_*``) have their own metric at 16k (``min_frac_decode_16k``)
and the ragged batch its own (``frac_ragged``).

Times per row, all with ``triton.testing.do_bench`` (median; it zeroes a 256 MB buffer, i.e.
flushes L2, before every repetition):

- ``time_us`` (and so ``frac``): the row timed as one layer of a captured decode step, the way a
  serving engine pays it. ``layers`` (8) independent layers, each with its own pool, query, tree
  and plan (its own ``MLAVerifyWrapper`` and workspace, ``plan()`` outside the timing), run back
  to back in ONE CUDA graph; ``time_us`` = the graph's replay time / layers. A layer inside a
  graph does not pay the ~5 µs launch floor of an isolated replay (about 1.6 µs per kernel, and
  its ramp overlaps the previous layer's tail).
- ``isolated_us``: the same planned call of layer 0 alone, captured in its own graph and replayed.
- ``eager_us``: that planned ``run`` launched eagerly (plus host launch cost).
- ``call_us`` / ``call_host_us``: the one-call ``mla_verify_attention``, eagerly, with device /
  host (CPU) indptrs (host planning included; host indptrs need no sync, as FlashInfer's ``plan``).

``max_eager_gap_us_b1`` / ``max_call_gap_us_b1`` are the largest ``eager_us - isolated_us`` and
``call_host_us - isolated_us`` over the B=1 sweep rows (the host-cost targets: within 10 and
30 µs). ``fixed_cost.md`` fits ``t = a + bytes / BW`` per (H, T) over the sweep's contexts (on
``time_us``), grouped by class.
Checks before timing: layer 0 through the one-call API, the eager planned call, its isolated
replay and the layered replay, each into a NaN-poisoned ``out``, against the fp32 oracle; every
other layer's output from the layered replay must be finite and bitwise equal to its own eager
planned call (the kernel is deterministic). A failing check makes ``rel_err`` inf or > 1e-2.
All use the default dispatch (``backend="auto"``): the Hopper path on an sm_90 GPU with
Gluon, the Triton path elsewhere; each row records the path its planned call used (``path``).

Artifacts (through ``runner.gatekit``): ``bench.json``, ``bench.md`` and two plots,
``roofline-fraction`` (fraction vs context per (H, T)) and ``kv-bandwidth`` (KV bandwidth vs
context, the naive oracle as reference series).

Gate: ``call: phases.kernel.benchmark:run``.
Standalone: ``python -m phases.kernel.benchmark [--quick] [--layers 8] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, astuple, dataclass, replace
from functools import partial
from pathlib import Path

import torch

from kernel.reference import mla_verify_reference
from phases.common.kernel_timing import bench_us, graph_replay, planned_run
from phases.common.roofline import (
    Ceilings,
    measure_ceilings,
    mla_verify_bytes,
    mla_verify_flops,
    roofline_time,
)
from phases.kernel.bench.cases import (
    PRODUCTION_SM_SCALE,
    Case,
    build_inputs,
    max_request_rel_err,
)
from phases.kernel.bench.fit import fit_fixed_cost, fit_table
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
    bound_class,
    context_label,
    decode_batch_shapes,
)
from runner import gatekit

ORACLE_MIN_CONTEXT = 16384
ORACLE_MAX_BYTES = 20 << 30
DEFAULT_LAYERS = 8  # layers of the captured step each row is timed in
L2_BYTES = 50 << 20  # the H200's L2; one row's layer pools hold at least twice this in total
POOL_FACTOR = 1.25  # pool slots per row read (randperm slots scattered over the pool)
LAYER_SEED_STRIDE = 100_003  # layer i of a row is seeded case.seed + i * stride
DECODE_METRIC_CONTEXT = 16384
KERNEL_TIMING = dict(warmup_ms=25, rep_ms=200)  # the replayed (device-time) measurements
HOST_TIMING = dict(warmup_ms=10, rep_ms=100)  # eager and one-call measurements (host-bound, ~100 µs+)


@dataclass
class BenchRow:
    """One timed configuration. Times in microseconds; ``oracle_us``/``speedup`` None when not timed.

    ``time_us`` is one layer of a ``layers``-layer captured step (graph replay / layers);
    ``frac``, ``kv_GBps`` and ``tflops`` are computed from it. ``isolated_us`` is the single
    call replayed alone (None where no graph could be captured)."""

    name: str
    kind: str  # "sweep" | "batch" | "decode" | "tree" | "causal" | "scattered" | "contiguous"
    context: int  # L (the largest L_b for a batch)
    num_heads: int
    num_draft: int
    batch_size: int
    total_kv: int
    time_us: float  # one layer of the layered CUDA-graph replay (eager sequence where no graph can be captured)
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
    isolated_us: float | None = None  # the planned call alone, CUDA-graph replay
    layers: int = 1  # layers in the graph that time_us divides


@dataclass(frozen=True)
class BenchSpec:
    """What to time: the (H, T) sweep over contexts, the ragged batch, the (B, H, L) decode rows
    and the two comparisons; ``layers``: layers of the captured step each row is timed in."""

    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    shapes: tuple[tuple[int, int], ...] = BENCH_SHAPES
    batch_contexts: tuple[int, ...] = BATCH8_CONTEXTS
    decode_shapes: tuple[tuple[int, int, int], ...] = tuple(decode_batch_shapes())
    comparison_context: int = COMPARISON_CONTEXT
    oracle_min_context: int = ORACLE_MIN_CONTEXT
    oracle_max_context: int | None = None  # None: no upper bound (the ~20 GB cap still applies)
    seed: int = 0
    layers: int = DEFAULT_LAYERS

    def __post_init__(self) -> None:
        if self.layers < 1:
            raise ValueError(f"Expected layers >= 1, got {self.layers}")


@dataclass(frozen=True)
class Times:
    """One row's measurements, µs (see the module docstring)."""

    layered_us: float
    isolated_us: float | None
    eager_us: float
    call_us: float
    call_host_us: float | None

    def best(self, other: "Times") -> "Times":
        """The faster of two rounds, field by field (None stays None)."""
        pick = lambda a, b: b if a is None else a if b is None else min(a, b)  # noqa: E731
        return Times(*(pick(a, b) for a, b in zip(astuple(self), astuple(other))))


def run(
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    seed: int = 0,
    oracle_max_context: int | None = None,
    artifacts_dir: str | None = None,
    layers: int = DEFAULT_LAYERS,
) -> dict:
    """Measure ceilings, then every row; return the gate's metrics.

    Args:
        contexts: L values of the (H, T) sweep.
        seed: input seed.
        oracle_max_context: time the oracle only up to this context (None: no upper bound;
            it is always skipped below 16k and above ~20 GB of temporaries).
        artifacts_dir: where ``bench.json``, ``bench.md`` and the plots go (None: the runner's
            artifacts through ``runner.gatekit``, nothing outside the runner).
        layers: layers of the captured step each row is timed in (``time_us`` = replay / layers).
    Returns:
        metrics: ``copy_bw_TBps``, ``bf16_TFLOPs``, ``min_frac_{memory,mid,compute}_{64k,16k}``,
        ``min_frac_decode_16k`` (the batched T=1 rows at 16k), ``frac_ragged`` and
        ``min_frac_batch8`` (the ragged B=8 batch), ``min_speedup_64k``, ``tree_mask_overhead``,
        ``scattered_overhead``, ``max_rel_err``, ``layers``, ``rows``, ``rows_hopper`` /
        ``rows_triton`` (rows whose planned call the default dispatch sent to each kernel path;
        each row's ``path`` is in bench.json and the table), ``elapsed_s`` and
        ``frac_<row>``/``us_<row>``/``isolated_us_<row>`` per row (e.g. ``frac_h16_t8_128k``).
        Fractions are of the layered time. A class metric is absent when no row of it ran.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("The benchmark gate needs a CUDA GPU (torch.cuda.is_available() is False)")
    from kernel import mla_verify_attention

    device = torch.device("cuda")
    started = time.perf_counter()
    ceilings = measure_ceilings(device)
    spec = BenchSpec(contexts=tuple(contexts), oracle_max_context=oracle_max_context, seed=seed, layers=layers)
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
    ``prepare_run(inputs, out) -> fn`` returns the zero-argument planned call (one per layer),
    timed eagerly as ``eager_us``; on a GPU layer 0's is replayed from a CUDA graph as
    ``isolated_us`` and all layers' from one graph as ``time_us`` (None: the one-call API
    itself, run eagerly, layer after layer).
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


@dataclass
class _Prepared:
    """One row's calls: ``calls[i]`` is layer i's eager call (layer 0 is the row's own inputs),
    ``isolated`` layer 0's replay, ``layered`` the replay of every layer in one graph (both the
    eager calls where no graph can be captured); ``outs[i]``: layer i's ``out``."""

    calls: list[Callable[[], object]]
    outs: list[torch.Tensor]
    isolated: Callable[[], object]
    layered: Callable[[], object]
    planned: bool  # the calls are prepare_run's planned calls (else the one-call API)

    @property
    def layers(self) -> int:
        return len(self.calls)


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
        """Check, then time one row on fresh pools (and the oracle, if ``oracle`` and in range)."""
        layer_inputs = self._layer_inputs(case)
        prepared = self._prepare(layer_inputs)
        rel_err = self._check(layer_inputs, prepared)
        times = self._time_kernel(layer_inputs[0], prepared)
        oracle_us = self._time_oracle(case, layer_inputs[0]) if oracle else None
        return self._row(name, kind, case, times, oracle_us, rel_err, _path_of(prepared), prepared.layers)

    def compare_tree_causal(self, case: Case) -> list[BenchRow]:
        """The same inputs (every layer's) with the tree mask and with ``tree_mask=None``, timed alternately."""
        tree_inputs = self._layer_inputs(case)
        causal_inputs = [{**inputs, "tree_mask": None} for inputs in tree_inputs]
        return self._pair(("tree", case, tree_inputs), ("causal", case, causal_inputs))

    def compare_layouts(self, case: Case) -> list[BenchRow]:
        """Scattered vs contiguous slots over the same pool data (layer by layer), timed alternately."""
        contiguous = Case(**{**asdict(case), "scattered": False})
        return self._pair(
            ("scattered", case, self._layer_inputs(case)),
            ("contiguous", contiguous, self._layer_inputs(contiguous)),
        )

    def _pair(self, *variants: tuple[str, Case, list[dict]]) -> list[BenchRow]:
        """Time variants in two alternating rounds and keep each one's faster median (drift-fair)."""
        prepared = [self._prepare(layer_inputs) for _, _, layer_inputs in variants]
        rel_errs = [self._check(layer_inputs, p) for (_, _, layer_inputs), p in zip(variants, prepared)]
        best: list[Times | None] = [None] * len(variants)
        for _ in range(2):
            for i, (_, _, layer_inputs) in enumerate(variants):
                times = self._time_kernel(layer_inputs[0], prepared[i])
                best[i] = times if best[i] is None else best[i].best(times)
        rows = []
        for (label, case, _), times, rel_err, p in zip(variants, best, rel_errs, prepared):
            base = f"h{case.num_heads}_t{case.draft_lens[0]}_{context_label(case.context_lens[0])}"
            rows.append(self._row(f"{base}_{label}", label, case, times, None, rel_err, _path_of(p), p.layers))
        return rows

    def _layer_inputs(self, case: Case) -> list[dict]:
        """``spec.layers`` input sets of ``case``: each layer its own pool, q, slots and tree
        (layer i seeded ``case.seed + i * LAYER_SEED_STRIDE``; layer 0 is ``case`` itself)."""
        pool_factor = layer_pool_factor(case, self.spec.layers)
        return [
            build_inputs(replace(case, seed=case.seed + i * LAYER_SEED_STRIDE), self.device, pool_factor=pool_factor)
            for i in range(self.spec.layers)
        ]

    def _prepare(self, layer_inputs: list[dict]) -> _Prepared:
        """Every layer's call into its own ``out``, layer 0's replay and the layered replay."""
        outs = [_empty_out(inputs) for inputs in layer_inputs]
        if self.prepare_run is None:
            calls = [partial(_one_call, self.attention_fn, inputs, out) for inputs, out in zip(layer_inputs, outs)]
        else:
            calls = [self.prepare_run(inputs, out) for inputs, out in zip(layer_inputs, outs)]
        step = partial(_run_all, calls)
        capture = self.prepare_run is not None and outs[0].is_cuda
        isolated = graph_replay(calls[0]) if capture else calls[0]
        layered = graph_replay(step) if capture else step
        return _Prepared(calls, outs, isolated, layered, planned=self.prepare_run is not None)

    def _time_kernel(self, inputs: dict, prepared: _Prepared) -> Times:
        """Layered replay (per layer), isolated replay, eager planned call, one-call API with
        device and with host indptrs (layer 0's inputs)."""
        out = prepared.outs[0]
        layered_us = self.time_fn(prepared.layered, **KERNEL_TIMING) / prepared.layers
        call_us = self.time_fn(lambda: self.attention_fn(**inputs, out=out), **HOST_TIMING)
        if not prepared.planned:
            return Times(layered_us, None, call_us, call_us, None)
        host = {**inputs, "qo_indptr": inputs["qo_indptr"].cpu(), "kv_indptr": inputs["kv_indptr"].cpu()}
        call_host_us = self.time_fn(lambda: self.attention_fn(**host, out=out), **HOST_TIMING)
        eager = prepared.calls[0]
        eager_us = self.time_fn(eager, **HOST_TIMING)
        isolated_us = None if prepared.isolated is eager else self.time_fn(prepared.isolated, **KERNEL_TIMING)
        return Times(layered_us, isolated_us, eager_us, call_us, call_host_us)

    def _check(self, layer_inputs: list[dict], prepared: _Prepared) -> float:
        """Largest per-request relative error of layer 0 vs the fp32 oracle over the one-call API,
        the eager planned call, its isolated replay and the layered replay (each into a
        NaN-poisoned ``out``); inf when any leaves NaN/inf, or when a layer's output from the
        layered replay is not bitwise its own eager call's."""
        inputs, out = layer_inputs[0], prepared.outs[0]
        oracle = mla_verify_reference(**inputs, compute_dtype=torch.float32, out_dtype=torch.float32)
        worst = 0.0
        calls = [partial(_one_call, self.attention_fn, inputs, out), prepared.calls[0]]
        calls += [c for c in (prepared.isolated, prepared.layered) if c not in calls]
        for call in calls:
            out.fill_(float("nan"))
            call()
            if not bool(torch.isfinite(out).all()):
                return float("inf")
            worst = max(worst, max_request_rel_err(out, oracle, inputs["qo_indptr"]))
        if not _layers_agree(prepared):
            return float("inf")
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
        times: Times,
        oracle_us: float | None,
        rel_err: float,
        path: str = "n/a",
        layers: int = 1,
    ) -> BenchRow:
        """A row from ``times``; roofline from the same-run ceilings, fractions from the layered time."""
        heads, drafts, contexts = case.num_heads, case.draft_lens, case.context_lens
        num_bytes = mla_verify_bytes(contexts, drafts, heads, HEAD_DIM, V_HEAD_DIM)
        flops = mla_verify_flops(contexts, drafts, heads, HEAD_DIM, V_HEAD_DIM)
        ideal_s = roofline_time(num_bytes, flops, self.ceilings)
        time_us = times.layered_us
        seconds = time_us * 1e-6
        rounded = lambda v: None if v is None else round(v, 2)  # noqa: E731
        return BenchRow(
            name=name,
            kind=kind,
            context=max(contexts),
            num_heads=heads,
            num_draft=drafts[0],
            batch_size=case.batch_size,
            total_kv=case.total_kv,
            time_us=round(time_us, 2),
            eager_us=round(times.eager_us, 2),
            call_us=round(times.call_us, 2),
            kv_GBps=round(case.total_kv * HEAD_DIM * 2 / seconds / 1e9, 1),
            tflops=round(flops / seconds / 1e12, 1),
            roofline_us=round(ideal_s * 1e6, 2),
            frac=round(ideal_s / seconds, 4),
            bound=bound_class(heads * drafts[0]),
            oracle_us=None if oracle_us is None else round(oracle_us, 1),
            speedup=None if oracle_us is None else round(oracle_us / time_us, 2),
            rel_err=rel_err,
            path=path,
            call_host_us=rounded(times.call_host_us),
            isolated_us=rounded(times.isolated_us),
            layers=layers,
        )


def layer_pool_factor(case: Case, layers: int) -> float:
    """Pool slots per KV row read for each of a row's ``layers`` pools: ``POOL_FACTOR``, or more where
    that keeps the layers' pools together under twice the L2 (``L2_BYTES``)."""
    row_bytes = case.head_dim * 2  # bf16 / fp16
    return max(POOL_FACTOR, 2 * L2_BYTES / layers / (case.total_kv * row_bytes))


def _one_call(attention_fn: Callable[..., torch.Tensor], inputs: dict, out: torch.Tensor) -> torch.Tensor:
    return attention_fn(**inputs, out=out)


def _run_all(calls: list[Callable[[], object]]) -> None:
    """One captured step: every layer's call, back to back."""
    for call in calls:
        call()


def _layers_agree(prepared: _Prepared) -> bool:
    """Every layer's output from the layered replay (NaN-poisoned first) is finite and bitwise
    equal to its own eager call's (layer 0's is also checked against the oracle)."""
    if prepared.layers == 1:
        return True
    for out in prepared.outs:
        out.fill_(float("nan"))
    prepared.layered()
    replayed = [out.clone() for out in prepared.outs]
    for call, out, got in zip(prepared.calls, prepared.outs, replayed):
        out.fill_(float("nan"))
        call()
        if not (bool(torch.isfinite(got).all()) and torch.equal(got, out)):
            return False
    return True


def _path_of(prepared: _Prepared) -> str:
    """The kernel path ("hopper" | "triton") layer 0's eager planned call last launched ("n/a" without one)."""
    wrapper = getattr(prepared.calls[0], "wrapper", None) if prepared.planned else None
    return getattr(wrapper, "path", None) or "n/a"


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
    _put_min(metrics, "frac_ragged", [r.frac for r in rows if r.kind == "batch"])
    _put_min(metrics, "min_frac_decode_16k",
             [r.frac for r in rows if r.kind == "decode" and r.context == DECODE_METRIC_CONTEXT])
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
    replayed = lambda r: r.time_us if r.isolated_us is None else r.isolated_us  # noqa: E731 - one call, alone
    _put_max(metrics, "max_eager_gap_us_b1", [r.eager_us - replayed(r) for r in b1])
    _put_max(metrics, "max_call_gap_us_b1",
             [r.call_host_us - replayed(r) for r in b1 if r.call_host_us is not None])
    metrics["max_rel_err"] = max(r.rel_err for r in rows)
    metrics["layers"] = max((r.layers for r in rows), default=0)
    metrics["rows"] = len(rows)
    metrics["rows_hopper"] = sum(r.path == "hopper" for r in rows)
    metrics["rows_triton"] = sum(r.path == "triton" for r in rows)
    for r in rows:
        metrics[f"frac_{r.name}"] = r.frac
        metrics[f"us_{r.name}"] = r.time_us
        if r.isolated_us is not None:
            metrics[f"isolated_us_{r.name}"] = r.isolated_us
    return metrics


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
        f"time_us: one layer of a {max((r.layers for r in rows), default=1)}-layer captured step (each layer its own "
        "pool, query and plan; one CUDA graph's replay / layers; frac, kv_GBps and TFLOP/s from it); "
        "isolated_us: the planned run alone, replayed from its own CUDA graph; eager_us: the same run "
        "launched eagerly; call_us / call_host_us: one-call mla_verify_attention, eagerly, with device / "
        "host indptrs (host planning included). L2 flushed before every repetition.",
        "",
        "| row | context | H | T | B | time_us | isolated_us | eager_us | call_us | call_host_us | kv_GBps | TFLOP/s "
        "| roofline_us | frac | bound | oracle_us | speedup | rel_err | path |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for r in rows:
        oracle = "n/a" if r.oracle_us is None else f"{r.oracle_us:.1f}"
        speedup = "n/a" if r.speedup is None else f"{r.speedup:.2f}"
        lines.append(
            f"| {r.name} | {context_label(r.context)} | {r.num_heads} | {r.num_draft} | {r.batch_size} | "
            f"{r.time_us:.1f} | {_cell(r.isolated_us)} | {r.eager_us:.1f} | {r.call_us:.1f} | "
            f"{_cell(r.call_host_us)} | {r.kv_GBps:.0f} | {r.tflops:.1f} | {r.roofline_us:.1f} | {r.frac:.3f} | "
            f"{r.bound} | "
            f"{oracle} | {speedup} | {r.rel_err:.2e} | {r.path} |"
        )
    return "\n".join(lines) + "\n"


def _cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


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
    directory: Path | None,
    rows: list[BenchRow],
    ceilings: Ceilings,
    device_info: dict,
    metrics: dict,
    table: str,
) -> None:
    """``bench.json`` (rows, ceilings, device, metrics), ``bench.md`` (the table) and the plots
    (see ``plots``): into ``directory``, or the runner's artifacts through ``runner.gatekit`` when it is None
    (nothing outside the runner)."""
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


def _empty_out(inputs: dict) -> torch.Tensor:
    """``q.dtype`` ``[N, H, DV]`` for ``build_inputs``' ``inputs``."""
    q = inputs["q"]
    return torch.empty(q.shape[0], q.shape[1], inputs["v_head_dim"], dtype=q.dtype, device=q.device)


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
    parser = argparse.ArgumentParser(description="Benchmark mla_verify_attention against the roofline and the oracle.")
    parser.add_argument("--quick", action="store_true", help="64k and 128k only; oracle at 64k only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="directory for bench.json, bench.md and the plots")
    parser.add_argument("--layers", type=int, default=DEFAULT_LAYERS, help="layers of the captured step per row")
    args = parser.parse_args(argv)
    common = dict(seed=args.seed, artifacts_dir=args.out, layers=args.layers)
    if args.quick:
        metrics = run(contexts=QUICK_CONTEXTS, oracle_max_context=65536, **common)
    else:
        metrics = run(**common)
    print(json.dumps(metrics, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
