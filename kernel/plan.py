"""Host-side planning of an MLA verify launch: tile configuration and work decomposition.

The split kernel's grid is a flat list of work items. A work item is one
(request b, M-block of packed rows, KV chunk) triple; packed row ``r = t * H + h`` holds
draft token ``t`` of head ``h``, so one KV tile loaded by a program serves every head and
draft token in its M-block. Work items of the same (request, KV chunk) are adjacent in the
grid, so programs that share a chunk run at the same time and the second read of a tile
hits L2 instead of memory.

Planning is pure Python over the per-request lengths. ``PlanLayout`` places the result in one
flat int32 metadata buffer at fixed offsets (a count header, the indptrs, the work items and the
row blocks), so a buffer sized once for the largest batch keeps its views across re-plans; work
items and workspace are bounded by ``max_work_items`` so a caller can preallocate both once
(CUDA graphs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


def next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


@dataclass(frozen=True)
class TileConfig:
    """Block sizes and launch parameters of the split kernel.

    block_m: packed (draft token, head) rows per program.  block_n: KV rows per tile.
    num_warps, num_stages: Triton launch parameters.  target_programs: work items to aim
    for when splitting KV (a multiple of the SM count).  min_chunk: fewest KV rows a split
    may own (amortizes the combine step).  keys_as_m: the Hopper path's keys-as-M split kernel
    (``kernel.hopper``); the Triton path ignores it.
    """

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    target_programs: int
    min_chunk: int = 256
    keys_as_m: bool = False

    def describe(self) -> str:
        name = f"BM{self.block_m}_BN{self.block_n}_w{self.num_warps}_s{self.num_stages}"
        return name + "_kM" if self.keys_as_m else name


@dataclass(frozen=True)
class HeadDims:
    """How a head dimension maps onto power-of-two Triton blocks.

    D = d_main + tail, with d_main the largest power of two <= D and the tail padded to
    ``d_tail`` (a power of two >= 16, or 0). For D=576 that is 512 + 64, no padding.
    V is the first DV values of each row, loaded in a ``block_dv`` block.
    """

    head_dim: int
    v_head_dim: int
    d_main: int
    d_tail: int
    block_dv: int

    @staticmethod
    def of(head_dim: int, v_head_dim: int) -> "HeadDims":
        d_main = 1 << (head_dim.bit_length() - 1)
        tail = head_dim - d_main
        d_tail = max(16, next_pow2(tail)) if tail else 0
        return HeadDims(head_dim, v_head_dim, d_main, d_tail, max(16, next_pow2(v_head_dim)))


def default_tile_config(max_rows: int, dims: HeadDims, num_sms: int, interpret: bool) -> TileConfig:
    """Pick a tile configuration for the widest request's packed row count ``max_rows`` = max_b T_b*H.

    Measured on an H200 at 128k context (phases/kernel/NOTES.md): one 16-row block with 8 warps and
    3 stages is the fastest configuration without register spills for up to 16 rows; past
    that a 64-row block with 8 warps (wgmma) wins by far despite its spills, because every
    extra row block re-reads the KV chunk from L2. One program per SM beat two.
    """
    if interpret:
        # Small tiles keep the CPU interpreter fast and still exercise multi-block paths.
        return TileConfig(block_m=16, block_n=16, num_warps=1, num_stages=1, target_programs=4, min_chunk=16)
    if max_rows <= 16:
        return TileConfig(block_m=16, block_n=64, num_warps=8, num_stages=3, target_programs=num_sms)
    return TileConfig(block_m=64, block_n=64, num_warps=8, num_stages=2, target_programs=num_sms)


@dataclass
class MLAVerifyPlan:
    """Work decomposition of one verify call (host lists; ``PlanLayout`` packs them for the device).

    Work item w: request ``work_req[w]``, M-block ``work_mblk[w]``, KV positions
    ``[work_kv_start[w], work_kv_end[w])`` of that request, ``work_nsplit[w]`` splits share its
    (request, M-block); keys before ``work_full_end[w]`` come in whole tiles of prefix keys
    that need no mask. Row block i (``mb_*``) lists the (request, M-block) pairs with their
    first work item, split count and the stride between their splits' work items, for the
    combine kernel.
    """

    config: TileConfig
    dims: HeadDims
    num_heads: int
    qo_lens: list[int]
    kv_lens: list[int]
    work_req: list[int] = field(default_factory=list)
    work_mblk: list[int] = field(default_factory=list)
    work_kv_start: list[int] = field(default_factory=list)
    work_kv_end: list[int] = field(default_factory=list)
    work_nsplit: list[int] = field(default_factory=list)
    work_full_end: list[int] = field(default_factory=list)
    mb_req: list[int] = field(default_factory=list)
    mb_mblk: list[int] = field(default_factory=list)
    mb_work_start: list[int] = field(default_factory=list)
    mb_nsplit: list[int] = field(default_factory=list)
    mb_stride: list[int] = field(default_factory=list)
    mask_offsets: list[int] = field(default_factory=list)
    chunk: int = 0

    @property
    def num_work(self) -> int:
        return len(self.work_req)

    @property
    def needs_combine(self) -> bool:
        return any(n > 1 for n in self.mb_nsplit)

    @property
    def num_row_blocks(self) -> int:
        return len(self.mb_req)


WORK_ARRAYS = ("work_req", "work_mblk", "work_kv_start", "work_kv_end", "work_full_end", "work_nsplit")
ROW_BLOCK_ARRAYS = ("mb_req", "mb_mblk", "mb_work_start", "mb_nsplit", "mb_stride")


@dataclass(frozen=True)
class PlanLayout:
    """Fixed offsets of a plan in one flat int32 metadata buffer of ``numel`` elements.

    Views (``views``): counts [2] (num_work, num_row_blocks: kernels launched on a larger grid
    read these and let the extra programs exit), qo_indptr and kv_indptr [max_batch + 1],
    mask_offsets [max_batch], work_* [max_work], mb_* [max_row_blocks]. Entries past a plan's
    sizes are zero and never read.
    """

    max_batch: int
    max_work: int
    max_row_blocks: int

    @staticmethod
    def exact(plan: MLAVerifyPlan) -> "PlanLayout":
        """The smallest layout that holds ``plan``."""
        return PlanLayout(len(plan.qo_lens), plan.num_work, plan.num_row_blocks)

    def sizes(self) -> dict[str, int]:
        sizes = {"counts": 2, "qo_indptr": self.max_batch + 1, "kv_indptr": self.max_batch + 1,
                 "mask_offsets": self.max_batch}
        sizes.update(dict.fromkeys(WORK_ARRAYS, self.max_work))
        sizes.update(dict.fromkeys(ROW_BLOCK_ARRAYS, self.max_row_blocks))
        return sizes

    @property
    def numel(self) -> int:
        return sum(self.sizes().values())

    def holds(self, plan: MLAVerifyPlan) -> bool:
        return (len(plan.qo_lens) <= self.max_batch and plan.num_work <= self.max_work
                and plan.num_row_blocks <= self.max_row_blocks)

    def views(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        """Named int32 views of ``buffer`` (int32 [>= numel])."""
        views, offset = {}, 0
        for name, size in self.sizes().items():
            views[name] = buffer[offset : offset + size]
            offset += size
        return views

    def pack(self, plan: MLAVerifyPlan) -> torch.Tensor:
        """``plan`` as a host int32 [numel] tensor in this layout (zeros past its sizes)."""
        assert self.holds(plan), "plan larger than the layout"
        values = {
            "counts": [plan.num_work, plan.num_row_blocks],
            "qo_indptr": _exclusive_sums(plan.qo_lens),
            "kv_indptr": _exclusive_sums(plan.kv_lens),
            "mask_offsets": plan.mask_offsets,
            **{name: getattr(plan, name) for name in WORK_ARRAYS + ROW_BLOCK_ARRAYS},
        }
        flat: list[int] = []
        for name, size in self.sizes().items():
            flat += values[name]
            flat += [0] * (size - len(values[name]))
        return torch.tensor(flat, dtype=torch.int32)


def _exclusive_sums(lengths: list[int]) -> list[int]:
    sums = [0]
    for length in lengths:
        sums.append(sums[-1] + length)
    return sums


def max_row_blocks(batch: int, max_draft: int, num_heads: int, config: TileConfig) -> int:
    """Upper bound on ``plan_work``'s row blocks: every request with ``max_draft`` drafts."""
    return batch * math.ceil(max_draft * num_heads / config.block_m)


def max_work_items(batch: int, max_draft: int, num_heads: int, config: TileConfig) -> int:
    """Upper bound on ``plan_work``'s work items for ``batch`` requests of up to ``max_draft`` drafts.

    With chunk >= sum_b(mblocks_b * L_b) / target_programs, sum_b mblocks_b * ceil(L_b / chunk)
    <= target_programs + sum_b mblocks_b, whatever the context lengths.
    """
    return config.target_programs + max_row_blocks(batch, max_draft, num_heads, config)


def plan_work(qo_lens: list[int], kv_lens: list[int], num_heads: int, dims: HeadDims, config: TileConfig) -> MLAVerifyPlan:
    """Split every request's KV range into chunks so about ``config.target_programs`` programs run.

    One chunk length (a multiple of block_n) is used for all requests, so long requests get
    more splits and the programs do similar amounts of work.
    """
    plan = MLAVerifyPlan(config, dims, num_heads, list(qo_lens), list(kv_lens))
    mblocks = [math.ceil(t * num_heads / config.block_m) for t in qo_lens]
    tile_work = sum(m * l for m, l in zip(mblocks, kv_lens))
    chunk = max(config.min_chunk, math.ceil(tile_work / max(1, config.target_programs)))
    chunk = math.ceil(chunk / config.block_n) * config.block_n
    plan.chunk = chunk
    offset = 0
    for b, (t, l, nm) in enumerate(zip(qo_lens, kv_lens, mblocks)):
        plan.mask_offsets.append(offset)
        offset += t * t
        nsplit = math.ceil(l / chunk)
        first = plan.num_work
        for s in range(nsplit):
            start, end = s * chunk, min(l, (s + 1) * chunk)
            full_end = start + max(0, min(end, l - t) - start) // config.block_n * config.block_n
            for m in range(nm):
                plan.work_req.append(b)
                plan.work_mblk.append(m)
                plan.work_kv_start.append(start)
                plan.work_kv_end.append(end)
                plan.work_full_end.append(full_end)
                plan.work_nsplit.append(nsplit)
        for m in range(nm):
            plan.mb_req.append(b)
            plan.mb_mblk.append(m)
            plan.mb_work_start.append(first + m)
            plan.mb_nsplit.append(nsplit)
            plan.mb_stride.append(nm)  # split s of this M-block is work item first + m + s * nm
    return plan
