"""Compile every kernel variant a plan can dispatch before serving: ``warmup`` (exported as ``kernel.warmup``).

A serving engine calls ``warmup(device, num_heads, max_draft)`` once per process (per head count
it serves), before its first request, so no request pays a compile (a cold Gluon compile of the
Hopper split kernel takes seconds). It runs one tiny probe batch through ``MLAVerifyWrapper`` per
tile configuration a batch of up to ``max_draft`` drafts per request can be planned with, with the
tree mask and causal, in eager mode and/or CUDA-graph mode, and launches the split merge in every
combine shape the path can choose. Because the probes go through the same entry points a caller
uses, with the same argument dtypes, strides and (16-byte aligned) metadata views, they hit exactly
the compiled specializations later calls look up.

Decisions:
- Probes, not hand-made compile keys: Triton's specialization key (constexprs, pointer dtypes and
  alignment, integer arguments that are 1 or multiples of 16, and ``num_heads`` for the Gluon
  kernels) is what a real call produces, so running a real call is the only way to be sure the
  key matches. The probe inputs are small (a few hundred keys; the wide-combine probe about
  ``num_sms * 128``) and each probe's output is checked finite.
- Covered: q bf16/fp16 ``[N, H, D]`` contiguous (any leading layout whose strides are multiples
  of 16 elements gives the same key), KV rows ``[slots, D]``, ``kv_index_dtype`` indices
  (int32 by default: int64 makes the Hopper path fall back to the Triton kernels over its plan,
  which the probes then compile), bool tree masks and causal, ``out`` contiguous. A call outside
  that (an ``out`` or q with odd strides, a uint8 mask) may still compile on first use.
- Under Triton's CPU interpreter nothing compiles; the probes still run through the Triton path
  (so the entry point is testable on a CPU machine).
- On a GPU the probes run in a pool of threads (``workers``), so their compiles overlap: Triton's
  compiler releases the GIL in its MLIR passes and in ptxas (two sm_90 compiles of the seesaw
  kernel took 14.3 s one after the other and 6.9 s in two threads on a 2-core CPU). Each probe has
  its own inputs, seeded by its index, so the probes and their order of completion are
  independent; two probes that need the same kernel may both compile it (Triton keeps one).
  Under the interpreter they run one after another.
"""

from __future__ import annotations

import contextlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from kernel import hopper
from kernel.mla_verify import COMBINE_COLS, COMBINE_SPLITS, MLAVerifyWrapper, _num_sms, interpreting
from kernel.plan import HeadDims, default_tile_config
from kernel.triton_kernels import _mla_verify_combine_kernel, _mla_verify_split_kernel, launch_combine
from kernel.validation import check_dims

PROBE_MIN_KEYS = 384  # keys of a probe request: several splits on both paths (Hopper splits own >= 128)
MAX_WORKERS = 8  # compile threads by default (at most the host's CPUs)


@dataclass(frozen=True)
class Probe:
    """One probe launch: ``path`` ("hopper" | "triton"), ``config`` (``TileConfig.describe()``),
    ``mask`` ("tree" | "causal"), ``mode`` ("eager" | "graph"), ``combine`` (splits per load,
    columns per program) for each merge launched."""

    path: str
    config: str
    mask: str
    mode: str
    draft: int
    keys: int
    combine: tuple[tuple[int, int], ...]

    def describe(self) -> str:
        shapes = ",".join(f"{s}x{c}" for s, c in self.combine) or "none"
        return f"{self.path} {self.config} {self.mask} {self.mode} T={self.draft} L={self.keys} combine={shapes}"


@dataclass
class WarmupReport:
    """What ``warmup`` ran: ``probes`` (one per split-kernel variant and mode), ``seconds`` (wall
    time, compiles included: the cold compile time on a first call), ``new_kernels`` (compiled
    specializations added to the in-process caches of the split and combine kernels: 0 when
    everything was already compiled; always 0 under the interpreter)."""

    device: str
    num_heads: int
    max_draft: int
    probes: list[Probe] = field(default_factory=list)
    seconds: float = 0.0
    new_kernels: int = 0

    def summary(self) -> str:
        lines = [f"warm-up on {self.device}: H={self.num_heads}, up to {self.max_draft} drafts: {len(self.probes)} "
                 f"probes, {self.new_kernels} new kernels, {self.seconds:.2f} s"]
        return "\n".join(lines + [f"  {p.describe()}" for p in self.probes])


def warmup(
    device: torch.device | str,
    num_heads: int,
    max_draft: int,
    head_dim: int = 576,
    v_head_dim: int = 512,
    dtype: torch.dtype = torch.bfloat16,
    *,
    use_cuda_graph: bool | None = None,
    max_batch: int = 1,
    kv_index_dtype: torch.dtype = torch.int32,
    workers: int | None = None,
) -> WarmupReport:
    """Compile every kernel variant ``MLAVerifyWrapper`` can dispatch for batches of requests with
    up to ``max_draft`` draft tokens (1 <= T_b <= max_draft) and ``num_heads`` heads of q's ``dtype``.

    Args:
        device: the CUDA device to compile for (a CPU device runs the probes under the interpreter).
        num_heads: H (the Gluon kernels specialize on it).
        max_draft: the most draft tokens of one request (1 for plain decode).
        head_dim, v_head_dim: D and DV (576 / 512 for DeepSeek-V3 MLA; the Hopper path needs them).
        dtype: q's and the KV pool's dtype (the Hopper path serves bf16 only).
        use_cuda_graph: False: the variants an eager wrapper plans (one per tile configuration the
            packed row counts ``t * num_heads``, t = 1..max_draft, map to; every combine shape);
            True: what a wrapper with a graph workspace for ``max_batch`` requests launches (its one
            pinned configuration, fixed grids, the graph combine shape); None (default): both.
        max_batch: requests of the graph workspace (only its grid size depends on it).
        kv_index_dtype: the ``kv_indices`` dtype the caller passes (int32 for the Hopper path).
        workers: threads the probes (and so their compiles) run in on a GPU; None: ``MAX_WORKERS``,
            at most the host's CPUs. A CPU device runs them in one.
    Returns:
        WarmupReport: the probes run, wall seconds (compiles included) and new compiled kernels.
    Raises:
        ValueError: for bad arguments; RuntimeError if a probe's output is not finite.
    Cheap once compiled: a second call launches the probes only (milliseconds).
    """
    device = torch.device(device)
    check_dims(head_dim, v_head_dim)
    if num_heads < 1 or not 1 <= max_draft <= 64:
        raise ValueError(f"Expected num_heads >= 1 and 1 <= max_draft <= 64, got {num_heads} and {max_draft}")
    if kv_index_dtype not in (torch.int32, torch.int64) or max_batch < 1:
        raise ValueError(f"Expected kv_index_dtype int32/int64 and max_batch >= 1, got {kv_index_dtype}, {max_batch}")
    if workers is not None and workers < 1:
        raise ValueError(f"Expected workers >= 1 or None, got {workers}")
    modes = {None: ("eager", "graph"), False: ("eager",), True: ("graph",)}[use_cuda_graph]
    report = WarmupReport(str(device), num_heads, max_draft)
    before = _cached_kernels()
    started = time.perf_counter()
    jobs = [(mode, draft, combines, causal) for mode in modes
            for draft, combines in _drafts_per_variant(device, num_heads, max_draft, head_dim, v_head_dim, dtype, mode)
            for causal in (False, True)]

    def probe(index: int) -> Probe:
        mode, draft, combines, causal = jobs[index]
        gen = torch.Generator(device="cpu").manual_seed(index)
        on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
        with on_device:  # the current CUDA device is per thread
            return run_probe(device, num_heads, draft, head_dim, v_head_dim, dtype, mode, max_batch, max_draft,
                          kv_index_dtype, causal, combines, gen)

    if device.type != "cuda":
        workers = 1  # Triton's interpreter patches its language module while a kernel runs: one thread
    elif workers is None:
        workers = min(MAX_WORKERS, os.cpu_count() or 1)
    if workers == 1 or len(jobs) <= 1:
        report.probes = [probe(i) for i in range(len(jobs))]
    else:
        with ThreadPoolExecutor(max_workers=min(workers, len(jobs)), thread_name_prefix="kernel-warmup") as pool:
            report.probes = list(pool.map(probe, range(len(jobs))))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    report.seconds = time.perf_counter() - started
    report.new_kernels = _cached_kernels() - before
    return report


def _drafts_per_variant(device, num_heads, max_draft, head_dim, v_head_dim, dtype, mode):
    """(draft count, combine shapes) per tile configuration a plan of ``mode`` can pick: the
    smallest T whose packed rows ``T * num_heads`` map to each configuration."""
    if mode == "graph":
        return [(max_draft, None)]  # the workspace pins the configuration of max_draft * H rows
    dims = HeadDims.of(head_dim, v_head_dim)
    probe = MLAVerifyWrapper(device)
    hopper_path = probe._hopper_ok and probe._hopper_dims(dims) and dtype == torch.bfloat16
    sms = _num_sms(device)
    chosen: dict = {}
    for t in range(1, max_draft + 1):
        rows = t * num_heads
        key = hopper.choose_variant(rows) if hopper_path else default_tile_config(rows, dims, sms, interpreting())
        chosen.setdefault(key, t)
    shapes = hopper.COMBINE_SHAPES if hopper_path else None
    return [(t, shapes) for t in chosen.values()]


def run_probe(device, num_heads, draft, head_dim, v_head_dim, dtype, mode, max_batch, max_draft, index_dtype, causal,
           combines, gen) -> Probe:
    """Plan and run one request of ``draft`` drafts through a wrapper of ``mode``; then launch the
    merge again in every other combine shape of ``combines`` (Hopper eager plans only)."""
    keys = max(PROBE_MIN_KEYS, draft)
    q = (torch.randn(draft, num_heads, head_dim, generator=gen) * 0.5).to(device=device, dtype=dtype)
    kv = torch.randn(keys + 16, head_dim, generator=gen).to(device=device, dtype=dtype)
    kv_indices = torch.randperm(keys + 16, generator=gen)[:keys].to(device=device, dtype=index_dtype)
    qo_indptr = torch.tensor([0, draft], dtype=torch.int32)
    kv_indptr = torch.tensor([0, keys], dtype=torch.int32)
    mask = None if causal else torch.ones(draft, draft, dtype=torch.bool).tril().flatten().to(device)
    if mode == "graph":
        workspace = MLAVerifyWrapper(device).allocate_workspace(max_batch, max_draft, num_heads, head_dim, v_head_dim,
                                                                use_cuda_graph=True)
        wrapper = MLAVerifyWrapper(device, workspace=workspace, use_cuda_graph=True)
    else:
        wrapper = MLAVerifyWrapper(device)
    plan = wrapper.plan(qo_indptr, kv_indptr, num_heads, head_dim, v_head_dim, dtype=dtype, kv_index_dtype=index_dtype)
    out = torch.full((draft, num_heads, v_head_dim), float("nan"), dtype=dtype, device=device)
    wrapper.run(q, kv, kv_indices, mask, out=out)
    _expect_finite(out, wrapper, "split kernel")
    launched = []
    fixed = mode == "graph"
    if wrapper.path == "hopper":
        ws, meta = wrapper._workspace, wrapper._meta
        if plan.needs_combine or fixed:
            launched.append(hopper.combine_shape(plan, ws.layout if fixed else None))
        rows = ws.layout.max_row_blocks if fixed else plan.num_row_blocks
        for shape in combines or ():
            if shape not in launched and plan.needs_combine:
                out.fill_(float("nan"))
                wrapper.run(q, kv, kv_indices, mask, out=out)  # fresh partials, then the merge in this shape
                launch_combine(out, ws.partial_o, ws.partial_lse, meta, meta["qo_indptr"], num_heads, rows,
                               plan.config.block_m, v_head_dim, *shape)
                _expect_finite(out, wrapper, f"combine {shape}")
                launched.append(shape)
    elif plan.needs_combine or fixed:
        launched.append((COMBINE_SPLITS, min(COMBINE_COLS, plan.dims.block_dv)))  # as mla_verify.run_plan
    return Probe(wrapper.path, plan.config.describe(), "causal" if causal else "tree", mode, draft, keys,
                 tuple(launched))


def _expect_finite(out: torch.Tensor, wrapper: MLAVerifyWrapper, what: str) -> None:
    if not bool(torch.isfinite(out).all()):
        raise RuntimeError(f"Expected a finite warm-up output from the {wrapper.path} path's {what}, got NaN/inf")


def _cached_kernels() -> int:
    """Compiled specializations in the in-process caches of every kernel a plan can launch."""
    kernels = [_mla_verify_split_kernel, _mla_verify_combine_kernel]
    if hopper.HAVE_GLUON:
        kernels += [hopper._split_kernel(hopper.DEFAULT_VARIANT), hopper._split_kernel(hopper.KEYS_AS_M_VARIANT)]
    total = 0
    for kernel in kernels:
        for caches in getattr(kernel, "device_caches", {}).values():
            total += len(caches[0])
    return total
