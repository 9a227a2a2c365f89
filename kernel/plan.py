"""Host-side planning of an MLA verify launch: tile configuration and work decomposition.

The split kernel's grid is a flat list of work items. A work item is one
(request b, M-block of packed rows, KV chunk) triple; packed row ``r = t * H + h`` holds
draft token ``t`` of head ``h``, so one KV tile loaded by a program serves every head and
draft token in its M-block. Work items of the same (request, KV chunk) are adjacent in the
grid, so programs that share a chunk run at the same time and the second read of a tile
hits L2 instead of memory.

Planning is vectorized numpy over the per-request lengths (host arrays, no device sync). ``PlanLayout`` places the result in one
flat int32 metadata buffer at fixed offsets (a count header, the indptrs, the work items and the
row blocks), so a buffer sized once for the largest batch keeps its views across re-plans; work
items and workspace are bounded by ``max_work_items`` so a caller can preallocate both once
(CUDA graphs).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np
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
    3 stages is the fastest configuration without register spills for up to 16 rows. Past that a
    64-row block (wgmma) was faster but spills 58-100 words for sm_90 in every warp / stage
    combination (NOTES: compile sweep), so the portable path takes 32-row blocks of 32 keys with
    8 warps and 2 stages, the widest configuration that compiles spill-free (sm_90 GPUs take the
    Hopper path for these shapes anyway). One program per SM beat two.
    """
    if interpret:
        # Small tiles keep the CPU interpreter fast and still exercise multi-block paths.
        return TileConfig(block_m=16, block_n=16, num_warps=1, num_stages=1, target_programs=4, min_chunk=16)
    if max_rows <= 16:
        return TileConfig(block_m=16, block_n=64, num_warps=8, num_stages=3, target_programs=num_sms)
    return TileConfig(block_m=32, block_n=32, num_warps=8, num_stages=2, target_programs=num_sms)


@dataclass
class MLAVerifyPlan:
    """Work decomposition of one verify call (host arrays; ``PlanLayout`` packs them for the device).

    Work item w: request ``work_req[w]``, M-block ``work_mblk[w]``, KV positions
    ``[work_kv_start[w], work_kv_end[w])`` of that request, ``work_nsplit[w]`` splits share its
    (request, M-block); keys before ``work_full_end[w]`` come in whole tiles of prefix keys
    that need no mask. Row block i (``mb_*``) lists the (request, M-block) pairs with their
    first work item, split count and the stride between their splits' work items, for the
    combine kernel. ``qo_lens``/``kv_lens`` are host lists; every other array is int64 numpy.
    """

    config: TileConfig
    dims: HeadDims
    num_heads: int
    qo_lens: list[int]
    kv_lens: list[int]
    work_req: np.ndarray = field(default_factory=lambda: _EMPTY)
    work_mblk: np.ndarray = field(default_factory=lambda: _EMPTY)
    work_kv_start: np.ndarray = field(default_factory=lambda: _EMPTY)
    work_kv_end: np.ndarray = field(default_factory=lambda: _EMPTY)
    work_nsplit: np.ndarray = field(default_factory=lambda: _EMPTY)
    work_full_end: np.ndarray = field(default_factory=lambda: _EMPTY)
    mb_req: np.ndarray = field(default_factory=lambda: _EMPTY)
    mb_mblk: np.ndarray = field(default_factory=lambda: _EMPTY)
    mb_work_start: np.ndarray = field(default_factory=lambda: _EMPTY)
    mb_nsplit: np.ndarray = field(default_factory=lambda: _EMPTY)
    mb_stride: np.ndarray = field(default_factory=lambda: _EMPTY)
    mask_offsets: np.ndarray = field(default_factory=lambda: _EMPTY)
    chunk: int = 0
    needs_combine: bool = False  # some row block has more than one split
    max_nsplit: int = 0  # the most splits of any row block
    # Contiguous fast path (``with_contiguity``): request b's first kv_contig[b] keys sit at slots
    # kv_start[b] + position (int64 [B]); None: every key is read through kv_indices.
    kv_start: np.ndarray | None = None
    kv_contig: np.ndarray | None = None

    @property
    def num_work(self) -> int:
        return len(self.work_req)


    @property
    def num_row_blocks(self) -> int:
        return len(self.mb_req)

    @property
    def num_tokens(self) -> int:
        """N = sum_b T_b (q's rows)."""
        return sum(self.qo_lens)

    @property
    def total_kv(self) -> int:
        """sum_b L_b (kv_indices entries the plan reads)."""
        return sum(self.kv_lens)

    @property
    def mask_numel(self) -> int:
        """sum_b T_b^2 (a tree mask's elements)."""
        return sum(t * t for t in self.qo_lens)


_EMPTY = np.zeros(0, dtype=np.int64)


WORK_ARRAYS = ("work_req", "work_mblk", "work_kv_start", "work_kv_end", "work_full_end", "work_nsplit")
ROW_BLOCK_ARRAYS = ("mb_req", "mb_mblk", "mb_work_start", "mb_nsplit", "mb_stride")


@dataclass(frozen=True)
class PlanLayout:
    """Fixed offsets of a plan in one flat int32 metadata buffer of ``numel`` elements.

    Views (``views``): counts [2] (num_work, num_row_blocks: kernels launched on a larger grid
    read these and let the extra programs exit), qo_indptr and kv_indptr [max_batch + 1],
    mask_offsets [max_batch], work_* [max_work], mb_* [max_row_blocks]. Entries past a plan's
    sizes are zero and never read.

    Every view starts at a multiple of ``ALIGN`` elements (16 bytes), whatever the sizes: Triton
    specializes a kernel on whether each pointer argument is 16-byte aligned, so views at offsets
    that moved with the batch size would compile new kernel variants for new batch sizes (and a
    warm-up could never cover them all).
    """

    ALIGN = 4  # int32 elements: 16 bytes

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
        sizes.update(kv_start=self.max_batch, kv_contig=self.max_batch)  # zeros: no contiguous keys
        return sizes

    def offsets(self) -> dict[str, int]:
        """Start of each view (a multiple of ``ALIGN``)."""
        offsets, offset = {}, 0
        for name, size in self.sizes().items():
            offsets[name] = offset
            offset += -(-size // self.ALIGN) * self.ALIGN
        return offsets

    @property
    def numel(self) -> int:
        return sum(-(-size // self.ALIGN) * self.ALIGN for size in self.sizes().values())

    def holds(self, plan: MLAVerifyPlan) -> bool:
        return (len(plan.qo_lens) <= self.max_batch and plan.num_work <= self.max_work
                and plan.num_row_blocks <= self.max_row_blocks)

    def views(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        """Named int32 views of ``buffer`` (int32 [>= numel])."""
        offsets = self.offsets()
        return {name: buffer[offsets[name] : offsets[name] + size] for name, size in self.sizes().items()}

    def pack(self, plan: MLAVerifyPlan, into: np.ndarray | None = None) -> np.ndarray:
        """``plan`` as an int32 [numel] array in this layout (zeros past its sizes), written
        into ``into`` (int32 [>= numel], e.g. a pinned staging buffer's numpy view) or a new array."""
        assert self.holds(plan), "plan larger than the layout"
        values = {
            "counts": (plan.num_work, plan.num_row_blocks),
            "qo_indptr": _exclusive_sums(plan.qo_lens),
            "kv_indptr": _exclusive_sums(plan.kv_lens),
            "mask_offsets": plan.mask_offsets,
            **{name: getattr(plan, name) for name in WORK_ARRAYS + ROW_BLOCK_ARRAYS},
            "kv_start": _EMPTY if plan.kv_start is None else plan.kv_start,
            "kv_contig": _EMPTY if plan.kv_contig is None else plan.kv_contig,
        }
        flat = np.zeros(self.numel, dtype=np.int32) if into is None else into[: self.numel]
        if into is not None:
            flat.fill(0)
        for name, offset in self.offsets().items():
            value = values[name]
            flat[offset : offset + len(value)] = value
        return flat


def _exclusive_sums(lengths) -> np.ndarray:
    """[0, l0, l0 + l1, ...] (len(lengths) + 1 entries)."""
    sums = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=sums[1:])
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


SCHEDULES = ("uniform", "balanced", "waves")
# A program's cost beyond its tiles (ramp to the first tile, epilogue), in tiles, when "waves"
# compares plans: ~3-4 µs of the fixed cost measured per program on an H200, ~2 tiles of 64 keys.
ITEM_OVERHEAD_TILES = 2


def _uniform_chunk(tile_work: int, programs: int, config: TileConfig) -> int:
    """One chunk length for every request: the work per program, at least ``min_chunk``, in whole tiles."""
    chunk = max(config.min_chunk, -(-tile_work // programs))
    return -(-chunk // config.block_n) * config.block_n


def _max_splits(l: np.ndarray, config: TileConfig) -> np.ndarray:
    """The most pieces request lengths ``l`` may be cut into: none shorter than ``min_chunk`` or a tile."""
    return np.maximum(1, l // max(config.min_chunk, config.block_n))


def _balanced_splits(l: np.ndarray, tile_work: int, programs: int, config: TileConfig) -> np.ndarray:
    """round(L_b / share) pieces per request (share = the batch's work per program, in keys)."""
    share = max(1.0, tile_work / programs)
    nsplit = np.clip(np.rint(l / share).astype(np.int64), 1, None)
    return np.minimum(nsplit, _max_splits(l, config))


def _one_wave_splits(l: np.ndarray, tiles: np.ndarray, mblocks: np.ndarray, programs: int,
                     config: TileConfig) -> np.ndarray | None:
    """ceil(tiles_b / P) pieces per request for the smallest P (tiles) whose pieces all run at once:
    sum_b mblocks_b * pieces_b <= programs. None when the row blocks alone outnumber the programs."""
    cap = _max_splits(l, config)

    def splits(p: int) -> np.ndarray:
        return np.minimum(-(-tiles // p), cap)

    rows = int(mblocks.sum())
    if len(l) == 0 or rows > programs:
        return None
    work = int((mblocks * tiles).sum())
    lo = max(1, -(-work // programs))  # items(p) >= work / p
    hi = int(tiles.max())  # one piece per request: items = rows, which fits
    if programs > rows:  # items(p) <= work / p + rows, so p >= work / (programs - rows) fits too
        hi = min(hi, -(-work // (programs - rows)))
    hi = max(lo, hi)
    while lo < hi:  # items(p) does not grow with p, and items(hi) fits
        mid = (lo + hi) // 2
        if int((mblocks * splits(mid)).sum()) <= programs:
            hi = mid
        else:
            lo = mid + 1
    return splits(lo)


def _pieces(l: np.ndarray, tiles: np.ndarray, mblocks: np.ndarray, nsplit: np.ndarray, chunk: int | None,
            bn: int) -> tuple[np.ndarray, ...]:
    """Work items in launch order (request-major, then split, then M-block): (request, index within the
    request, each request's first item (exclusive sums, B + 1), first key, end key). ``chunk``: every
    piece ``chunk`` keys but a request's last; None: request b's ``nsplit_b`` pieces differ by at most
    one tile."""
    works = nsplit * mblocks
    first = _exclusive_sums(works)
    req = np.repeat(np.arange(len(l), dtype=np.int64), works)
    local = np.arange(int(first[-1]), dtype=np.int64) - first[:-1][req]
    split = local // mblocks[req]
    length = l[req]
    if chunk is not None:
        start = split * chunk
        end = np.minimum(length, start + chunk)
    else:  # split s: tiles [s * tiles / n, (s + 1) * tiles / n)
        n, tiles_r = nsplit[req], tiles[req]
        start = split * tiles_r // n * bn
        end = np.minimum(length, (split + 1) * tiles_r // n * bn)
    return req, local, first, start, end


def program_makespan(item_tiles, programs: int, overhead: float = ITEM_OVERHEAD_TILES) -> float:
    """When the last of the work items (tiles each, in launch order) finishes, in tiles, if each of
    ``programs`` SMs runs one at a time and takes the next item as it frees (the hardware's block
    scheduler), each item costing ``overhead`` tiles more than its tiles."""
    cost = (np.asarray(item_tiles, dtype=np.float64) + overhead).tolist()
    if len(cost) <= programs:
        return max(cost, default=0.0)
    free = sorted(cost[:programs])  # a sorted list is a heap
    for c in cost[programs:]:
        heapq.heapreplace(free, free[0] + c)
    return max(free)


def _fastest_split(l: np.ndarray, tiles: np.ndarray, mblocks: np.ndarray, tile_work: int, programs: int,
                   config: TileConfig) -> tuple[np.ndarray, int | None]:
    """(nsplit, chunk) of the one-wave, balanced or uniform split, whichever ``program_makespan`` says
    finishes first (then the fewer work items). Only splits whose lower bound (the longest piece, or
    the work spread over every SM; pieces cover whole tiles, so the work is the same for all) can beat
    the best so far are simulated."""
    bn = config.block_n
    chunk = _uniform_chunk(tile_work, programs, config)
    one_wave = _one_wave_splits(l, tiles, mblocks, programs, config)
    candidates = [] if one_wave is None else [(one_wave, None)]
    candidates += [(_balanced_splits(l, tile_work, programs, config), None), (-(-l // chunk), chunk)]
    work = int((mblocks * tiles).sum())
    best, best_key = None, None
    for nsplit, c in candidates:
        items = int((mblocks * nsplit).sum())
        longest = int(np.minimum(tiles, c // bn).max()) if c is not None else int((-(-tiles // nsplit)).max())
        lower = max(longest + ITEM_OVERHEAD_TILES, (work + ITEM_OVERHEAD_TILES * items) / programs)
        if best is not None and (lower, items) >= best_key:
            continue
        if items <= programs:
            key = (float(longest + ITEM_OVERHEAD_TILES), items)
        else:
            _, _, _, start, end = _pieces(l, tiles, mblocks, nsplit, c, bn)
            key = (program_makespan(-(-(end - start) // bn), programs), items)
        if best is None or key < best_key:
            best, best_key = (nsplit, c), key
    return best


def plan_work(qo_lens: list[int], kv_lens: list[int], num_heads: int, dims: HeadDims, config: TileConfig,
              schedule: str = "uniform") -> MLAVerifyPlan:
    """Split every request's KV range into chunks so about ``config.target_programs`` programs run.

    ``schedule="uniform"`` (the default): one chunk length (a multiple of block_n, at least
    ``min_chunk``) for all requests, so long requests get more splits; a request's last split
    is whatever is left (it can be one tile). ``schedule="balanced"``: the batch's work W =
    sum_b mblocks_b * L_b divided evenly over the ``target_programs`` SMs, each request split into
    round(L_b / share) pieces of equal length (share = W / target_programs; at least one, and no
    piece shorter than ``min_chunk`` or one tile), so a request is split only where it holds
    more than about 1.5 shares and no split is a leftover sliver (FlashMLA's
    ``get_mla_metadata`` divides the work the same way over persistent programs; here each piece
    is its own program). ``schedule="waves"``: of the uniform split, the balanced one and the
    shortest equal pieces that all run in one wave (sum_b mblocks_b * pieces_b <= target_programs),
    the one whose last program finishes first when the SMs take the programs in launch order
    (``program_makespan``): one program per SM, as the Hopper kernels' shared memory allows.
    All keep ``max_work_items``' bound.

    Request b's work items are ``nsplit_b * mblocks_b`` consecutive entries, split-major: split s
    of M-block m is item ``first_b + s * mblocks_b + m``. Vectorized with numpy: the plan is on
    every call's host path. ``plan.chunk`` is the longest chunk.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"Expected schedule in {SCHEDULES}, got {schedule!r}")
    qo_lens, kv_lens = list(qo_lens), list(kv_lens)
    plan = MLAVerifyPlan(config, dims, num_heads, qo_lens, kv_lens)
    t = np.asarray(qo_lens, dtype=np.int64)
    l = np.asarray(kv_lens, dtype=np.int64)
    bm, bn = config.block_m, config.block_n
    mblocks = -(-t * num_heads // bm)
    tile_work = int((mblocks * l).sum())
    programs = max(1, config.target_programs)
    tiles = -(-l // bn)
    if schedule == "uniform":
        chunk = _uniform_chunk(tile_work, programs, config)
        nsplit = -(-l // chunk)
    elif schedule == "balanced":
        nsplit, chunk = _balanced_splits(l, tile_work, programs, config), None
    else:
        nsplit, chunk = _fastest_split(l, tiles, mblocks, tile_work, programs, config)
    if chunk is not None:
        plan.chunk = chunk
    else:
        plan.chunk = int((-(-tiles // nsplit)).max() * bn) if len(l) else 0
    plan.mask_offsets = _exclusive_sums(t * t)[:-1]
    req, local, first, start, end = _pieces(l, tiles, mblocks, nsplit, chunk, bn)
    requests = np.arange(len(t), dtype=np.int64)
    nm = mblocks[req]
    plan.work_req, plan.work_mblk = req, local % nm
    plan.work_kv_start, plan.work_kv_end = start, end
    plan.work_full_end = start + np.maximum(0, np.minimum(end, l[req] - t[req]) - start) // bn * bn
    plan.work_nsplit = nsplit[req]
    mb_req = np.repeat(requests, mblocks)
    mb_mblk = np.arange(int(mblocks.sum()), dtype=np.int64) - _exclusive_sums(mblocks)[:-1][mb_req]
    plan.mb_req, plan.mb_mblk = mb_req, mb_mblk
    plan.mb_work_start = first[:-1][mb_req] + mb_mblk
    plan.mb_nsplit = nsplit[mb_req]
    plan.mb_stride = mblocks[mb_req]  # split s of this M-block is work item mb_work_start + s * mb_stride
    nonempty = nsplit[mblocks > 0]
    plan.needs_combine = bool((nonempty > 1).any())
    plan.max_nsplit = int(nonempty.max()) if len(nonempty) else 0
    return plan


def with_contiguity(plan: MLAVerifyPlan, kv_start, kv_contig=None) -> MLAVerifyPlan:
    """``plan`` with the contiguous fast path: request b's first ``kv_contig[b]`` keys sit at slots
    ``kv_start[b] + position`` (``kv_start[b] = -1``: none). ``kv_contig`` None: every request
    with a start has its whole prefix (``L_b - T_b`` keys) there. The kernels trust it: the caller
    states it from its slot table (``contiguous_runs`` computes it from host indices).
    ValueError for a length that is not the batch's, a count outside [0, L_b], or a count
    without a start."""
    batch = len(plan.kv_lens)
    start = np.asarray(kv_start, dtype=np.int64).reshape(-1)
    lengths = np.asarray(plan.kv_lens, dtype=np.int64)
    contig = start if kv_contig is None else np.asarray(kv_contig, dtype=np.int64).reshape(-1)
    if len(start) != batch or len(contig) != batch:
        raise ValueError(f"Expected kv_start and kv_contig of the batch's {batch} requests, got {len(start)} and {len(contig)}")
    if kv_contig is None:
        contig = np.where(start >= 0, lengths - np.asarray(plan.qo_lens, dtype=np.int64), 0)
    bad = np.flatnonzero((contig < 0) | (contig > lengths) | ((contig > 0) & (start < 0)))
    if len(bad):
        b = int(bad[0])
        raise ValueError(f"Expected 0 <= kv_contig[b] <= L_b and kv_start[b] >= 0 where kv_contig[b] > 0, got "
                         f"kv_start={int(start[b])}, kv_contig={int(contig[b])}, L={int(lengths[b])} for request {b}")
    plan.kv_start, plan.kv_contig = np.where(contig > 0, start, -1), contig
    return plan


def contiguous_runs(kv_indptr, kv_indices) -> tuple[np.ndarray, np.ndarray]:
    """(kv_start, kv_contig) int64 [B] from host ``kv_indptr`` [B+1] and ``kv_indices``: each
    request's first slot and the length of its leading run of consecutive slots."""
    indptr = np.asarray(kv_indptr, dtype=np.int64).reshape(-1)
    slots = np.asarray(kv_indices, dtype=np.int64).reshape(-1)
    starts, runs = [], []
    for b in range(len(indptr) - 1):
        s = slots[indptr[b] : indptr[b + 1]]
        if len(s) == 0:
            starts.append(-1)
            runs.append(0)
            continue
        breaks = np.flatnonzero(s - np.arange(len(s)) != s[0])
        starts.append(int(s[0]))
        runs.append(int(breaks[0]) if len(breaks) else len(s))
    return np.asarray(starts, dtype=np.int64), np.asarray(runs, dtype=np.int64)
