"""Hopper (sm_90) MLA tree-verify attention written in Gluon, with explicit pipelining.

Same contract, numerics and work decomposition as the Triton path (``kernel.plan``): work
items over (request, block of packed (draft token, head) rows, key range), fp32 partial
outputs + log2-sum-exp per split, merged by a combine kernel. Same masking (prefix visible,
tree mask on the last T_b keys, causal without a mask), ragged batches, no atomics
(bitwise-identical reruns), output written only at real rows of ``out``.

Three split kernels; the first two warp-specialized around the same producer:

* producer partition (4 warps): gathers 64 KV rows per stage with 16-byte ``cp.async`` into
  a 2-deep ring (the 512-wide latent part and the 64-wide rope part in separate power-of-two
  shared buffers). The next tile's slot indices are loaded before waiting for a free slot, so
  no gather waits on a dependent index load; with the contiguous fast path (``KV_START`` /
  ``KV_CONTIG``, compiled out when not given) keys of a request's leading run of consecutive
  slots are addressed as ``start + position`` instead. Each producer thread arrives on the slot's "full"
  mbarrier when its copies land (``cp.async.mbarrier.arrive.noinc``); the consumer releases
  the slot on its "empty" mbarrier.
* ``_mla_verify_hopper_split_kernel`` (64 packed rows per work item, 8-warp consumer = two
  warpgroups; chosen for 17 to 127 packed rows): S = Q Kᵀ with ``warpgroup_mma`` where the
  warpgroups own different key columns of S (no duplicated Q·Kᵀ), online softmax in fp32, P
  staged in shared memory, O += P V with each warpgroup owning 256 of the 512 output columns.
* ``_mla_verify_hopper_keys_as_m_kernel`` (16 packed rows, one-warpgroup consumer): keys are
  the wgmma M dimension (Sᵀ = K Qᵀ, Oᵀ += Vᵀ Pᵀ), a quarter of the padded tensor work of the
  64-row tile; chosen for up to 16 rows (``choose_variant``).
* ``_mla_verify_hopper_seesaw_kernel`` (``kernel/hopper_seesaw.py``, 64 packed rows): FlashMLA's
  organisation, no producer partition, each warpgroup the scores of its own tiles and half the
  output columns, P exchanged through shared memory, its own cp.async gathers (same contiguous
  fast path); chosen from 128 packed rows.

This module is the host side: ``available``, ``supported``, ``choose_variant``, ``make_plan``,
``plan_tensors``, ``allocate_workspace``, ``run_split_and_combine``;
``compile_for_sm90`` and ``resource_stats`` compile without a GPU and report registers, spills
and shared memory. The Gluon kernels are in ``kernel/hopper_gluon.py`` and ``kernel/hopper_seesaw.py``;
the split merge is the Triton path's combine kernel (``kernel.triton_kernels.launch_combine``).
Measurements and every variant tried: phases/kernel/NOTES.md, "Hopper path".
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton

from kernel.plan import HeadDims, MLAVerifyPlan, PlanLayout, TileConfig, plan_work
from kernel.triton_kernels import launch_combine

try:  # Gluon ships with Triton >= 3.5; keep this module importable without it.
    from kernel.hopper_gluon import _mla_verify_hopper_keys_as_m_kernel, _mla_verify_hopper_split_kernel
    from kernel.hopper_seesaw import _mla_verify_hopper_seesaw_kernel

    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

LOG2E = 1.4426950408889634
HEAD_DIM = 576
V_HEAD_DIM = 512
D_MAIN = 512
D_TAIL = 64
BLOCK_M = 64
BLOCK_N = 64  # keys per tile (32- and 16-key tiles lost: phases/kernel/NOTES.md)
STAGES = 2  # tiles in the shared ring (a third 72 KB stage does not fit next to Q)
PRODUCER_WARPS = 4
PRODUCER_REGS = 56
CONSUMER_WARPS = 8
SEESAW_CONSUMER_REGS = 256  # the seesaw kernel's second warpgroup (a worker partition; no producer partition)
# Combine shapes (splits merged per load, output columns per program), measured on an H200
# (phases/kernel/NOTES.md, "The combine's shape"): the merge is latency-bound, so each plan takes the
# shape that launches about COMBINE_PROGRAMS programs (one per packed row and column block): a row
# block's rows x 512 / columns. Few rows have many splits (B=1 memory-bound rows: ~128 over 16-64
# rows) and take every split in one load over 32 columns; many rows have few (at most ~132 / row
# blocks: 1024 rows, 9 splits) and take whole 512-column rows, 8 splits a load. Alone, at 2048 rows
# of 4 splits (B=16 H=128): 35.3 -> 10.9 µs against (32, 128); (128, 8) 64k: 24.6 -> 12.2.
# A CUDA graph's grid is fixed at capture, when the real plan's rows and splits are not known: the
# shape follows the layout's rows. Up to GRAPH_WIDE_MAX_ROWS (a decode bucket of one request: 16 heads
# over ~128 splits at 64k) the merge takes every split in one load over 32 columns (that plan alone,
# eager: 16.4 -> 8.7 µs against (32, 128); phases/kernel/NOTES.md); past it the rows have few splits
# each and (32, 128) measured faster.
COMBINE_WIDE = (256, 32)
COMBINE_NARROW = (32, 128)
GRAPH_WIDE_MAX_ROWS = 64
COMBINE_SHAPES = (COMBINE_WIDE, (64, 64), COMBINE_NARROW, (16, 256), (8, 512))  # by columns, ascending
COMBINE_PROGRAMS = 1024
MIN_CHUNK = 128  # keys per split at least: two 64-key tiles, so a 16k context fills 128 SMs, not 64


@dataclass(frozen=True)
class Variant:
    """Compile-time shape of the split kernel: ``keys_as_m`` selects the one-warpgroup keys-as-M
    consumer for ``block_m`` packed rows (16 measured), ``seesaw`` the FlashMLA organisation of 64
    rows (``kernel/hopper_seesaw.py``: each warpgroup its own tiles, half the output columns), else
    the two-warpgroup 64-row kernel. All read ``BLOCK_N``-key tiles through a ``STAGES``-deep ring."""

    keys_as_m: bool = False
    block_m: int = BLOCK_M
    seesaw: bool = False

    def describe(self) -> str:
        name = f"BN{BLOCK_N}_S{STAGES}"
        if self.seesaw:
            return "seesaw_" + name
        return f"kM{self.block_m}_" + name if self.keys_as_m else name

    @property
    def num_warps(self) -> int:
        """Warps of the default partition (the launch's ``num_warps``)."""
        return 4 if self.keys_as_m or self.seesaw else CONSUMER_WARPS


DEFAULT_VARIANT = Variant()  # 64-row tiles, two warpgroups behind a producer: 17 to 127 packed rows
KEYS_AS_M_VARIANT = Variant(keys_as_m=True, block_m=16)  # one warpgroup, keys as M: up to 16 packed rows
SEESAW_VARIANT = Variant(seesaw=True)  # FlashMLA's two-warpgroup seesaw for 64-row tiles: from 128 packed rows
SEESAW_MIN_ROWS = 128
# The variants the path uses, in the order phases/kernel/bench/hopper_check.py times them. Every
# variant measured (the losers included) is in phases/kernel/NOTES.md, "Hopper path".
VARIANTS = (DEFAULT_VARIANT, KEYS_AS_M_VARIANT, SEESAW_VARIANT)
# Variants under measurement, timed next to VARIANTS by hopper_check ($VARIANTS names them); empty
# between experiments: a variant that lost leaves the source and its numbers stay in the notes.
CANDIDATES: tuple[Variant, ...] = ()


def choose_variant(max_rows: int) -> Variant:
    """The variant for a batch whose widest request has ``max_rows`` = max_b T_b * H packed rows.

    Measured on an H200 (phases/kernel/NOTES.md, "Hopper path"): keys-as-M wins by 1.3-1.5x for up to 16
    rows (H=16 decode) and loses by 1.15-2.4x from 128 rows (each extra 16-row block re-reads the
    chunk); from 128 rows the seesaw beats the two-warpgroup kernel (1.27-1.33x at (H, T) = (128, 8),
    1.15x on the ragged batch, 1.1x at 64k-128k with 128 rows; within 10% either way at 16k), which
    stays between (the seesaw lost at 16 rows); the 64-key, 2-stage tiles beat every 32- and 16-key
    variant everywhere.
    """
    if max_rows <= KEYS_AS_M_VARIANT.block_m:
        return KEYS_AS_M_VARIANT
    return SEESAW_VARIANT if max_rows >= SEESAW_MIN_ROWS else DEFAULT_VARIANT


def tile_config(num_sms: int, variant: Variant = DEFAULT_VARIANT) -> TileConfig:
    """The work decomposition ``variant`` consumes: ``block_m``-row blocks, ``BLOCK_N``-key tiles,
    about one program per SM."""
    return TileConfig(block_m=variant.block_m, block_n=BLOCK_N, num_warps=variant.num_warps,
                      num_stages=STAGES, target_programs=num_sms, min_chunk=MIN_CHUNK, keys_as_m=variant.keys_as_m)


def variant_of(config: TileConfig) -> Variant:
    """The variant whose ``tile_config`` has ``config``'s tiles (the first in ``VARIANTS``);
    ValueError for a configuration no variant consumes."""
    for v in VARIANTS:
        if (v.block_m, BLOCK_N, v.keys_as_m, STAGES, v.num_warps) == (
                config.block_m, config.block_n, config.keys_as_m, config.num_stages, config.num_warps):
            return v
    raise ValueError(f"Expected a Hopper tile configuration (hopper.tile_config), got {config.describe()}")


def _split_constexprs(variant: Variant) -> dict:
    constexprs = dict(BLOCK_M=variant.block_m, BLOCK_N=BLOCK_N, D_MAIN=D_MAIN, D_TAIL=D_TAIL, DV=V_HEAD_DIM,
                      STAGES=STAGES, PRODUCER_WARPS=PRODUCER_WARPS, PRODUCER_REGS=PRODUCER_REGS,
                      NUM_WARPS=variant.num_warps)
    if variant.seesaw:
        constexprs["CONSUMER_REGS"] = SEESAW_CONSUMER_REGS
    return constexprs


def _split_kernel(variant: Variant):
    if variant.seesaw:
        return _mla_verify_hopper_seesaw_kernel
    return _mla_verify_hopper_keys_as_m_kernel if variant.keys_as_m else _mla_verify_hopper_split_kernel


def kernel_name(variant: Variant) -> str:
    """The name of the Gluon kernel ``variant`` launches (as profilers and ``ptxas`` show it)."""
    return _split_kernel(variant).__name__


def available(device: torch.device | str) -> bool:
    """Whether this path can run on ``device`` at all: Gluon importable, not Triton's CPU
    interpreter (Gluon does not run there), a CUDA device of compute capability (9, 0) (False,
    not an error, for "cuda" where torch sees no CUDA device)."""
    device = torch.device(device)
    if (not HAVE_GLUON or device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
            or not torch.cuda.is_available()):
        return False
    return _capability(device.index if device.index is not None else torch.cuda.current_device()) == (9, 0)


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def supported(q: torch.Tensor, kv_cache: torch.Tensor, v_head_dim: int = V_HEAD_DIM,
              kv_indices: torch.Tensor | None = None) -> bool:
    """Whether this Hopper kernel serves the call: Gluon available, an sm_90 CUDA device, bf16,
    576-wide rows (512 latent + 64 rope, V = latent), contiguous KV rows and q's last dim, int32 indices."""
    return available(q.device) and supported_inputs(q, kv_cache, v_head_dim, kv_indices)


def supported_inputs(q: torch.Tensor, kv_cache: torch.Tensor, v_head_dim: int = V_HEAD_DIM,
                     kv_indices: torch.Tensor | None = None) -> bool:
    """``supported`` without the device check (for a caller that made it once, as the wrapper does)."""
    rows = kv_cache.reshape(kv_cache.shape[0], -1) if kv_cache.dim() == 3 else kv_cache
    return (
        q.dtype == torch.bfloat16 and kv_cache.dtype == torch.bfloat16
        and q.dim() == 3 and q.shape[-1] == HEAD_DIM and v_head_dim == V_HEAD_DIM
        and rows.dim() == 2 and rows.shape[-1] == HEAD_DIM and rows.stride(-1) == 1 and rows.stride(0) == HEAD_DIM
        and q.stride(-1) == 1
        and (kv_indices is None or kv_indices.dtype == torch.int32)
    )


def default_schedule(num_requests: int) -> str:
    """How ``plan_work`` splits the keys of a batch of ``num_requests`` on this path: "waves" (of the
    uniform split, the balanced one and the shortest pieces that all run in one wave, whichever
    finishes first) for two or more, "uniform" for one (its leftover slivers pack onto the spare SMs: it finishes first at
    every B=1 shape the benchmark times, and costs a third of the host time). Measured on an H200
    with the seesaw (phases/kernel/NOTES.md): against the uniform chunk, dividing a batch's work
    evenly over the SMs took B=64 H=128 4k from 0.34 to 0.74 of the roofline and 16k from 0.61 to
    0.86 (the uniform chunk left a second wave of one-tile slivers and a merge); "waves" also keeps
    the ragged batch in one wave (130 programs, where round(L / share) pieces made 134)."""
    return "waves" if num_requests > 1 else "uniform"


def make_plan(qo_lens: list[int], kv_lens: list[int], num_heads: int, num_sms: int,
              variant: Variant | None = None, schedule: str | None = None) -> MLAVerifyPlan:
    """``kernel.plan.plan_work`` with the tile configuration of ``variant`` (None: ``choose_variant``).

    The work decomposition is the Triton path's: work items over (request, row block, key
    range), a combine kernel merging the splits of every row block that has more than one;
    ``schedule`` as ``plan_work``'s ("uniform", "balanced" or "waves"; None: ``default_schedule``).
    """
    if schedule is None:
        schedule = default_schedule(len(qo_lens))
    if variant is None:
        variant = choose_variant(max(qo_lens, default=1) * num_heads)
    return plan_work(qo_lens, kv_lens, num_heads, HeadDims.of(HEAD_DIM, V_HEAD_DIM), tile_config(num_sms, variant),
                     schedule=schedule)


def plan_tensors(plan: MLAVerifyPlan, device: torch.device | str) -> dict[str, torch.Tensor]:
    """``plan`` on ``device`` as the named int32 views ``run_split_and_combine`` reads
    (``PlanLayout.exact(plan).views``: counts, indptrs, mask_offsets, work_*, mb_*)."""
    layout = PlanLayout.exact(plan)
    return layout.views(torch.from_numpy(layout.pack(plan)).to(device))


def allocate_workspace(num_work: int, device: torch.device, block_m: int = BLOCK_M) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 partial outputs [num_work, block_m, 512] and LSEs [num_work, block_m] for ``num_work``
    work items (room for every variant when block_m is 64)."""
    n = max(1, num_work)
    return (torch.empty((n, block_m, V_HEAD_DIM), dtype=torch.float32, device=device),
            torch.empty((n, block_m), dtype=torch.float32, device=device))


def combine_shape(plan: MLAVerifyPlan, layout: PlanLayout | None = None) -> tuple[int, int]:
    """(splits merged per load, output columns per program) of the combine for ``plan``: of
    ``COMBINE_SHAPES``, the widest whose programs (packed rows x 512 / columns) are at least
    ``COMBINE_PROGRAMS`` (the narrowest where none is).

    layout: a CUDA graph's fixed layout (None: an eager plan). Its grid is captured once for every
    later plan, so the shape follows the layout's packed rows: ``COMBINE_WIDE`` up to
    ``GRAPH_WIDE_MAX_ROWS``, ``COMBINE_NARROW`` past them."""
    if layout is not None:
        graph_rows = layout.max_row_blocks * plan.config.block_m
        return COMBINE_WIDE if graph_rows <= GRAPH_WIDE_MAX_ROWS else COMBINE_NARROW
    rows = plan.num_row_blocks * plan.config.block_m
    fits = [s for s in COMBINE_SHAPES if rows * (V_HEAD_DIM // s[1]) >= COMBINE_PROGRAMS]
    return fits[-1] if fits else COMBINE_SHAPES[0]


def _check_launch(plan, q, kv, kv_indices, out, partial_o, partial_lse, bm: int) -> None:
    if plan.needs_combine and (partial_o.numel() < plan.num_work * bm * V_HEAD_DIM
                               or partial_lse.numel() < plan.num_work * bm):  # unsplit items write out only
        raise ValueError(f"Expected partials for {plan.num_work} work items of {bm} rows, got "
                         f"{partial_o.numel()} and {partial_lse.numel()} elements")
    if not supported(q, kv, V_HEAD_DIM, kv_indices) or out.stride(2) != 1:
        raise ValueError("Expected bf16 q [N, H, 576] and KV rows [slots, 576] with unit last strides, int32 "
                         "kv_indices, out with a unit last stride, on an sm_90 device (see supported())")


def run_split_and_combine(
    plan: MLAVerifyPlan,
    plan_tensors: dict[str, torch.Tensor],
    q: torch.Tensor,
    kv: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    tree_mask: torch.Tensor | None,
    sm_scale: float,
    out: torch.Tensor,
    partial_o: torch.Tensor,
    partial_lse: torch.Tensor,
    variant: Variant | None = None,
    layout: PlanLayout | None = None,
    checked: bool = False,
) -> None:
    """Launch the Gluon split kernel over ``plan`` (from ``make_plan``; its config must be
    ``tile_config``) and, when a row block has several splits, the combine kernel.

    plan_tensors: ``PlanLayout.views`` of the uploaded plan (``counts``, ``mask_offsets``, ``work_*``,
    ``mb_*``). layout: the grids' size (None: exactly ``plan``); with a larger layout (CUDA graphs)
    the grids cover it, the combine always launches, and programs past ``counts`` exit without
    writing, so a captured launch stays valid for any later plan the layout holds.
    q: [N, H, 576] bf16; kv: [slots, 576] bf16 rows; kv_indices: int32; tree_mask: bool/uint8
    [sum T_b^2] or None (causal); out: [N, H, 512] (written only at real rows);
    partial_o / partial_lse: from ``allocate_workspace`` with at least ``plan.num_work`` items.
    variant: the one ``plan`` was made for (None: ``choose_variant``, as ``make_plan`` does).
    checked: the caller (``MLAVerifyWrapper.run``) already validated the inputs and the partials
    against this plan, so the per-call checks are skipped (host cost).
    Launches only device work (no host sync), so it can be captured in a CUDA graph.
    """
    if variant is None:
        variant = choose_variant(max(plan.qo_lens, default=1) * plan.num_heads)
    cfg = plan.config
    if (cfg.block_m, cfg.block_n, cfg.keys_as_m) != (variant.block_m, BLOCK_N, variant.keys_as_m):
        raise ValueError(f"Expected a plan made for {variant.describe()}, got one for {cfg.describe()}")
    fixed_grid = layout is not None
    shape = combine_shape(plan, layout)
    layout = layout or PlanLayout.exact(plan)
    if layout.max_work == 0:
        return
    bm = cfg.block_m
    if variant.seesaw and (plan.chunk // (2 * BLOCK_N) + 1) * plan.num_heads >= 1 << 30:
        raise ValueError(f"Expected tile pairs per split x heads < 2**30 for {variant.describe()} (hopper_seesaw._q_view), "
                         f"got a chunk of {plan.chunk} keys and {plan.num_heads} heads")
    kv = kv.reshape(kv.shape[0], -1) if kv.dim() == 3 else kv  # [slots, 576]
    if not checked:
        _check_launch(plan, q, kv, kv_indices, out, partial_o, partial_lse, bm)
    causal = tree_mask is None
    mask_arg = kv_indices if causal else tree_mask.view(torch.uint8)
    fn = _split_kernel(variant)
    contiguous = {"KV_START": plan_tensors["kv_start"], "KV_CONTIG": plan_tensors["kv_contig"]} \
        if plan.kv_contig is not None and "KV_CONTIG" in fn.arg_names else {}  # the contiguous fast path
    fn[(layout.max_work,)](
        q, kv, kv_indices, mask_arg, out, partial_o, partial_lse,
        plan_tensors["counts"], qo_indptr, kv_indptr, plan_tensors["mask_offsets"],
        plan_tensors["work_req"], plan_tensors["work_mblk"], plan_tensors["work_kv_start"],
        plan_tensors["work_kv_end"], plan_tensors["work_full_end"], plan_tensors["work_nsplit"],
        plan.num_heads, sm_scale * LOG2E, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        CAUSAL=causal, num_warps=variant.num_warps,
        **_split_constexprs(variant), **contiguous,
    )
    if plan.needs_combine or fixed_grid:
        launch_combine(out, partial_o, partial_lse, plan_tensors, qo_indptr, plan.num_heads, layout.max_row_blocks, bm,
                       V_HEAD_DIM, *shape)


def compile_for_sm90(causal: bool = False, variant: Variant = DEFAULT_VARIANT, contiguous: bool = False):
    """Compile the split kernel for sm_90 without a GPU (pointer args 16-byte aligned);
    ``contiguous``: with the contiguous fast path (``KV_START`` / ``KV_CONTIG``).

    Returns the compiled kernel: ``.n_regs``, ``.n_spills``, ``.metadata.shared``."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    fn = _split_kernel(variant)
    pointers = {"Q": "*bf16", "KV": "*bf16", "KV_INDICES": "*i32", "TREE_MASK": "*u8", "OUT": "*bf16",
                "PARTIAL_O": "*fp32", "PARTIAL_LSE": "*fp32", "COUNTS": "*i32", "QO_INDPTR": "*i32", "KV_INDPTR": "*i32",
                "MASK_OFFSETS": "*i32", "W_REQ": "*i32", "W_MBLK": "*i32", "W_KV_START": "*i32",
                "W_KV_END": "*i32", "W_FULL_END": "*i32", "W_NSPLIT": "*i32"}
    if contiguous:
        pointers |= {"KV_START": "*i32", "KV_CONTIG": "*i32"}
    scalars = {"num_heads": "i32", "qk_scale": "fp32", "stride_qn": "i32", "stride_qh": "i32",
               "stride_on": "i32", "stride_oh": "i32"}
    constexprs = dict(_split_constexprs(variant), CAUSAL=causal)
    if not contiguous:
        constexprs |= {"KV_START": None, "KV_CONTIG": None}
    signature = {name: pointers.get(name) or scalars.get(name) or "constexpr" for name in fn.arg_names}
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in pointers
             if name not in ("KV_START", "KV_CONTIG")}  # per-request arrays: any alignment
    src = GluonASTSource(fn, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": variant.num_warps})


def resource_stats(compiled) -> dict:
    """Registers, spill bytes and shared memory of a kernel compiled by ``compile_for_sm90``,
    read from ``ptxas -v`` on its PTX (a CPU-side compile carries no driver statistics)."""
    import os
    import re
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90).path
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        log = subprocess.run([ptxas, "-v", "--gpu-name", "sm_90a", ptx, "-o", os.path.join(tmp, "k.cubin")],
                             capture_output=True, text=True, check=True).stderr
    spills = [int(a) + int(b) for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)]
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", log)]
    maxnreg = [int(r) for r in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+);", compiled.asm["ptx"])]
    return {"n_regs": max(regs), "n_spills": sum(spills), "shared_bytes": int(compiled.metadata.shared),
            "setmaxnreg": sorted(set(maxnreg))}
