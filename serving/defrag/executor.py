"""Applying a ``MovePlan`` to a ``KVPool``: rows on every layer, then the slot table and the
allocator, a budget of moves at a time, possibly across engine steps.

Decisions:
- Destinations are reserved when the compaction starts (``SlotAllocator.reserve``): the free
  slots the plan writes, and after each piece the slots it vacated that a later move writes.
  Between steps the engine allocates only from what is left, so a plan stays valid across the
  steps it spans; ``cancel`` (or the end) returns what was not used.
- The plan is a hint, the pool's bookkeeping the truth: every move is checked against it just
  before it runs (the request still holds that row at that position; the destination is
  reserved, free, or vacated by the same piece). A move that fails the check (its request
  finished since the plan) is dropped, and so are the moves that waited for it to vacate a slot.
- A piece (``split_waves``) is atomic: rows are copied, then the slot table renamed, then the
  allocator moved; an exception at any point undoes what was done, so the rows every request
  owns, the table (host and device) and the allocator (free set and hand-out order) are as
  before the piece. Pieces applied before it in the same call stay applied (a valid state).
- Device copy: when no destination of a piece is one of its sources (nearly always), one Triton
  launch copies each row straight from source to destination on every layer (no temporary:
  bytes read + written = 2 x rows moved), and a failure cannot damage a live row (every
  destination was free). When they overlap, the sources are gathered first
  into a temporary, then scattered (two Triton launches: torch's ``index_select`` /
  ``index_copy_`` over the slot dimension run at a fraction of the copy bandwidth), and
  restored from the gathered copy if anything fails. On a CPU (no interpreter) both use torch.
- Never under a live graph: ``step`` refuses to run while the current CUDA stream is capturing
  (moves are host-driven and would be recorded, then replayed with stale slots).
- ``faults`` (tests): a callable invoked at "copy", "table" and "allocator" inside a piece; raising
  there exercises the undo.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from serving.defrag.planner import MovePlan, split_waves
from serving.device.capture_guard import collected_before_capture
from serving.kv.pool import KVPool

ROW_WORDS_PER_PROGRAM = 4096  # 32-bit words one program copies per layer (16 KB)


@triton.jit
def _move_rows_kernel(IN, OUT, SRC, DST, n, N_PTR, in_layer, in_row, out_layer, out_row,
                      W_MAIN: tl.constexpr, W_TAIL: tl.constexpr, W: tl.constexpr, BLOCK_R: tl.constexpr,
                      SRC_IS_ARANGE: tl.constexpr, DST_IS_ARANGE: tl.constexpr, N_ON_DEVICE: tl.constexpr):
    """Grid: (cdiv(n, BLOCK_R), layers). IN, OUT: words [layers, rows, W] (any strides); SRC,
    DST: int64 [n] (ignored when ``*_IS_ARANGE``: row i). Copies IN row SRC[i] to OUT row
    DST[i] of the program's layer; rows are W words, read as a power-of-two main part and a
    masked tail. ``N_ON_DEVICE``: the row count is N_PTR[0] (at most ``n``, the grid's size),
    so one captured launch serves any count; programs past it return."""
    if N_ON_DEVICE:
        n = tl.load(N_PTR)
        if tl.program_id(0) * BLOCK_R >= n:
            return
    i = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = i < n
    if SRC_IS_ARANGE:
        src = i.to(tl.int64)
    else:
        src = tl.load(SRC + i, mask=ok, other=0)
    if DST_IS_ARANGE:
        dst = i.to(tl.int64)
    else:
        dst = tl.load(DST + i, mask=ok, other=0)
    layer = tl.program_id(1).to(tl.int64)
    base_in = IN + layer * in_layer
    base_out = OUT + layer * out_layer
    cols = tl.arange(0, W_MAIN)
    main = tl.load(base_in + src[:, None] * in_row + cols[None, :], mask=ok[:, None], eviction_policy="evict_first")
    if W_TAIL > 0:
        tail_cols = W_MAIN + tl.arange(0, W_TAIL)
        tail_ok = ok[:, None] & (tail_cols[None, :] < W)
        tail = tl.load(base_in + src[:, None] * in_row + tail_cols[None, :], mask=tail_ok, eviction_policy="evict_first")
    tl.store(base_out + dst[:, None] * out_row + cols[None, :], main, mask=ok[:, None], cache_modifier=".cs")
    if W_TAIL > 0:
        tl.store(base_out + dst[:, None] * out_row + tail_cols[None, :], tail, mask=tail_ok, cache_modifier=".cs")


def _words(kv: torch.Tensor) -> torch.Tensor:
    """``kv`` [layers, slots, D] as 32-bit words (16-bit if a row is an odd number of halves)."""
    row_bytes = kv.shape[-1] * kv.element_size()
    word = torch.int32 if row_bytes % 4 == 0 else torch.int16 if row_bytes % 2 == 0 else torch.uint8
    return kv.view(word)


def _copy_rows(src_kv: torch.Tensor, dst_kv: torch.Tensor, src: torch.Tensor | None, dst: torch.Tensor | None,
               n: int, n_on_device: torch.Tensor | None = None) -> None:
    """``dst_kv[:, dst] = src_kv[:, src]`` for n rows, one launch (None: rows 0..n-1);
    ``n_on_device``: int64 [1], the count (at most n) read by the kernel."""
    if n == 0:
        return
    words_in, words_out = _words(src_kv), _words(dst_kv)
    w = words_in.shape[-1]
    w_main = 1 << (w.bit_length() - 1)
    w_tail = 0 if w == w_main else max(16, 1 << (w - w_main - 1).bit_length())
    block_r = max(1, min(64, ROW_WORDS_PER_PROGRAM // w_main))
    _move_rows_kernel[(triton.cdiv(n, block_r), words_in.shape[0])](
        words_in, words_out, words_in if src is None else src, words_in if dst is None else dst, n,
        words_in if n_on_device is None else n_on_device,
        words_in.stride(0), words_in.stride(1), words_out.stride(0), words_out.stride(1),
        W_MAIN=w_main, W_TAIL=w_tail, W=w, BLOCK_R=block_r,
        SRC_IS_ARANGE=src is None, DST_IS_ARANGE=dst is None, N_ON_DEVICE=n_on_device is not None, num_warps=4,
    )


def copy_rows_direct(kv: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """``kv[:, dst] = kv[:, src]`` with one Triton launch, no temporary. kv: [layers, slots, D]
    with unit last stride; src, dst: int64 [n] on kv's device, no destination among the sources."""
    _copy_rows(kv, kv, src, dst, src.numel())


def gather_rows(kv: torch.Tensor, src: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``kv[:, src]`` into ``out`` [layers, n, D] (None: a new tensor), one Triton launch (``index_select``)."""
    if out is None:
        out = torch.empty(kv.shape[0], src.numel(), kv.shape[2], dtype=kv.dtype, device=kv.device)
    _copy_rows(kv, out, src, None, src.numel())
    return out


def scatter_rows(kv: torch.Tensor, dst: torch.Tensor, rows: torch.Tensor) -> None:
    """``kv[:, dst] = rows`` (rows: [layers, n, D]), one Triton launch (``index_copy_``)."""
    _copy_rows(rows, kv, None, dst, dst.numel())


def warm_up_copy(kv: torch.Tensor) -> None:
    """Compile the row copies for ``kv`` before they are needed: the direct copy, the gather and
    the scatter, each for every specialization of the row count (1, a multiple of 16, other),
    each copying the padding slot 0 onto itself, so no compaction (and no timed one) pays a
    compile."""
    if not kv.is_cuda:
        return
    for n in (1, 16, 17):
        zeros = torch.zeros(n, dtype=torch.int64, device=kv.device)
        copy_rows_direct(kv, zeros, zeros)
        scatter_rows(kv, zeros, gather_rows(kv, zeros))


class RowMover:
    """Direct row copies (``copy_rows_direct``) of up to ``capacity`` rows on every layer of ``kv``
    as one CUDA-graph replay: the count and the indices live in a device buffer the kernel reads,
    so a piece costs an upload and a replay, not a Triton launch (tens of microseconds of host
    time on a busy server's CPU, during which the GPU waits).

    load(src, dst) uploads a piece (int arrays, n <= capacity, no destination among the sources);
    replay() copies it. Made between steps (capture must not overlap another capture); valid while
    ``kv`` lives.
    """

    def __init__(self, kv: torch.Tensor, capacity: int) -> None:
        if not kv.is_cuda or capacity < 1:
            raise ValueError(f"Expected a CUDA pool and capacity >= 1, got {kv.device} and {capacity}")
        self.kv = kv
        self.capacity = -(-capacity // 16) * 16  # even: dst stays 16-byte aligned
        cap = self.capacity
        self.index = torch.zeros(2 + 2 * cap, dtype=torch.int64, device=kv.device)  # [n, pad, src.., dst..]
        args = (kv, kv, self.index[2 : 2 + cap], self.index[2 + cap :], cap, self.index[:1])
        _copy_rows(*args)  # compiled (n = 0: every program returns) before the capture
        torch.cuda.synchronize(kv.device)
        self.graph = torch.cuda.CUDAGraph()
        with collected_before_capture(), torch.cuda.graph(self.graph):
            _copy_rows(*args)

    def load(self, src: np.ndarray, dst: np.ndarray) -> None:
        n = len(src)
        if n > self.capacity or len(dst) != n:
            raise ValueError(f"Expected at most {self.capacity} moves with as many destinations, got {n} and {len(dst)}")
        host = np.zeros(2 + 2 * self.capacity, dtype=np.int64)  # fresh: the upload may still read it
        host[0] = n
        host[2 : 2 + n] = src
        host[2 + self.capacity : 2 + self.capacity + n] = dst
        self.index.copy_(torch.from_numpy(host), non_blocking=True)

    def replay(self) -> None:
        self.graph.replay()


@dataclass
class ExecutorStats:
    """Moves applied and dropped, pieces (those copied by a ``RowMover`` replay), bytes (read +
    written, every layer), host seconds."""

    applied: int = 0
    dropped: int = 0
    pieces: int = 0
    replayed: int = 0
    bytes: int = 0
    host_s: float = 0.0
    launch_s: float = 0.0  # host time inside the timed windows (with events): the launches


class Compaction:
    """One compaction: ``plan`` applied to ``pool`` by ``step`` calls (between engine steps).

    copy: "triton" (one launch per piece, on CUDA or under Triton's interpreter), "torch"
    (gather then scatter), or "auto" (triton on CUDA, torch on a CPU). mover: a ``RowMover`` of
    this pool (CUDA): pieces without overlap that fit it are copied by its graph replay. events:
    record CUDA events around each piece's device copy (``device_seconds``). faults: see the
    module docstring.
    """

    def __init__(self, pool: KVPool, plan: MovePlan, *, copy: str = "auto", mover: RowMover | None = None,
                 events: bool = False, faults: Callable[[str], None] | None = None) -> None:
        if copy not in ("auto", "triton", "torch"):
            raise ValueError(f"Expected copy in ('auto', 'triton', 'torch'), got {copy!r}")
        if mover is not None and mover.kv is not pool.kv:
            raise ValueError("Expected a RowMover made for this pool's rows, got one of another tensor")
        self.pool, self.plan = pool, plan
        self.copy = ("triton" if pool.kv.is_cuda else "torch") if copy == "auto" else copy
        self.mover = mover if self.copy == "triton" else None
        self.faults = faults
        self.stats = ExecutorStats()
        self.next = 0
        self._req, self._pos = plan.req.astype(np.int64), plan.pos.astype(np.int64)
        self._src, self._dst = plan.src.astype(np.int64), plan.dst.astype(np.int64)
        self._last_write = np.full(pool.num_slots, -1, dtype=np.int64)  # slot -> the last move writing it
        np.maximum.at(self._last_write, self._dst, np.arange(len(self._dst)))
        alloc = pool.allocator
        reserve = plan.initially_free_destinations(alloc.free_mask()).tolist() if len(self._dst) else []
        self.reserved = set(reserve)
        self._reserved_mask = np.zeros(pool.num_slots, dtype=bool)  # the same set, for vectorized checks
        self._reserved_mask[reserve] = True
        alloc.reserve(reserve)
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] | None = [] if events and pool.kv.is_cuda else None
        self.row_bytes = pool.kv.shape[0] * pool.kv.shape[2] * pool.kv.element_size()

    @property
    def done(self) -> bool:
        return self.next >= len(self._src)

    @property
    def remaining(self) -> int:
        return len(self._src) - self.next

    def step(self, max_moves: int | None = None) -> int:
        """Apply the next ``max_moves`` moves (None: all); returns the moves applied. Releases
        the leftover reservations when the plan is finished."""
        if self.pool.kv.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("Expected compaction between steps, got a CUDA graph capture in progress")
        t0 = time.perf_counter()
        end = len(self._src) if max_moves is None else min(len(self._src), self.next + max(1, max_moves))
        base, applied = self.next, 0
        try:
            for w0, w1 in split_waves(self._src[base:end], self._dst[base:end]):
                applied += self._apply(base + w0, base + w1)
        finally:
            self.stats.host_s += time.perf_counter() - t0
        if self.done:
            self.cancel()
        return applied

    def run(self, max_moves: int | None = None) -> int:
        """Every remaining move, ``max_moves`` at a time."""
        total = 0
        while not self.done:
            total += self.step(max_moves)
        return total

    def cancel(self) -> None:
        """Stop here: return every slot still reserved to the pool."""
        if self.reserved:
            self.pool.allocator.free(sorted(self.reserved))
            self.reserved.clear()
            self._reserved_mask[:] = False
        self.next = len(self._src)

    def device_seconds(self) -> float:
        """Device time of the pieces' copies so far (needs ``events=True`` on CUDA; synchronizes)."""
        return sum(self.piece_seconds())

    def piece_seconds(self) -> list[float]:
        """Device time of each piece's copy so far (see ``device_seconds``)."""
        if not self._events:
            return []
        torch.cuda.synchronize()
        return [a.elapsed_time(b) / 1e3 for a, b in self._events]

    # ---- one piece -------------------------------------------------------------------

    def _checked(self, k0: int, k1: int) -> np.ndarray:
        """The moves of [k0, k1) still valid against the pool (see the module docstring)."""
        keep = np.arange(k0, k1)
        if self._all_valid(k0, k1):
            return keep
        table, alloc = self.pool.table, self.pool.allocator
        while True:
            sources = set(self._src[keep].tolist())
            ok = []
            for k in keep.tolist():
                r, p, s, d = int(self._req[k]), int(self._pos[k]), int(self._src[k]), int(self._dst[k])
                holds = r in table and p < table.length(r) and table.slots(r)[p] == s
                if holds and (d in self.reserved or alloc.is_free(d) or d in sources):
                    ok.append(k)
            if len(ok) == len(keep):
                return keep
            keep = np.asarray(ok, dtype=np.int64)  # a dropped move no longer vacates its source: check again

    def _all_valid(self, k0: int, k1: int) -> bool:
        """Whether every move of [k0, k1) holds (vectorized; the usual case between steps):
        its row is where the plan says, its destination reserved or vacated by the piece."""
        src, dst = self._src[k0:k1], self._dst[k0:k1]
        try:
            self.pool.table.check_rename_at(self._req[k0:k1].tolist(), self._pos[k0:k1].tolist(), src.tolist())
        except ValueError:
            return False
        return bool((self._reserved_mask[dst] | np.isin(dst, src)).all())

    def _apply(self, k0: int, k1: int) -> int:
        keep = self._checked(k0, k1)
        self.stats.dropped += (k1 - k0) - len(keep)
        if len(keep):
            self._commit(keep)
        self.next = k1
        self.stats.applied += len(keep)
        self.stats.pieces += bool(len(keep))
        self.stats.bytes += 2 * len(keep) * self.row_bytes
        return len(keep)

    def _fault(self, where: str) -> None:
        if self.faults is not None:
            self.faults(where)

    def _commit(self, keep: np.ndarray) -> None:
        """Apply the checked moves ``keep`` (indices into the plan) as one atomic piece. Every
        precondition of the table's and the allocator's updates was just checked (``_checked``):
        they run without checking again (``checked=True``)."""
        pool, table, alloc = self.pool, self.pool.table, self.pool.allocator
        req, pos, src_a, dst_a = self._req[keep], self._pos[keep], self._src[keep], self._dst[keep]
        req, pos, src, dst = req.tolist(), pos.tolist(), src_a.tolist(), dst_a.tolist()
        res_a = dst_a[self._reserved_mask[dst_a]]
        res = res_a.tolist()
        n = len(src)
        overlap = bool(np.isin(dst_a, src_a).any())
        triton_copy = self.copy == "triton"
        graph_copy = self.mover is not None and not overlap and n <= self.mover.capacity
        # Everything the copy needs is ready before the first event: the window holds the copy.
        if graph_copy:
            self.mover.load(src_a, dst_a)
        else:  # an even row width keeps dst_t 16-byte aligned: no new kernel specialization mid-compaction
            host = np.zeros((2, n + n % 2), dtype=np.int64)
            host[0, :n], host[1, :n] = src_a, dst_a
            indices = torch.from_numpy(host).to(pool.kv.device, non_blocking=True)
            src_t, dst_t = indices[0, :n], indices[1, :n]
        timed = self._events is not None
        if timed:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        gathered = None
        scratch = pool.kv.new_empty(pool.kv.shape[0], n, pool.kv.shape[2]) if overlap and triton_copy else None
        stage = 0
        try:
            if timed:
                start.record()
                launch_t0 = time.perf_counter()
            if graph_copy:
                self.mover.replay()
            elif not triton_copy:  # every source read first, into [layers, n, D]
                gathered = pool.kv.index_select(1, src_t)
                pool.kv.index_copy_(1, dst_t, gathered)
            elif overlap:
                gathered = gather_rows(pool.kv, src_t, scratch)
                scatter_rows(pool.kv, dst_t, gathered)
            else:
                copy_rows_direct(pool.kv, src_t, dst_t)
            if timed:
                self.stats.launch_s += time.perf_counter() - launch_t0
                end.record()
                self._events.append((start, end))
            self._fault("copy")
            table.rename_at(req, pos, src, dst, checked=True)
            stage = 1
            self._fault("table")
            alloc.free(res, checked=True)
            stage = 2
            self._fault("allocator")
            alloc.relocate(src, dst, checked=True)
            stage = 3
            self.stats.replayed += graph_copy
        except BaseException:
            if stage >= 2:
                alloc.reserve(res)
            if stage >= 1:
                table.rename_at(req, pos, dst, src)
            if gathered is not None:
                pool.kv.index_copy_(1, src_t, gathered)  # sources a destination overwrote
            raise
        self.reserved.difference_update(res)
        self._reserved_mask[res_a] = False
        vacated = src_a[(self._last_write[src_a] > keep[-1]) & alloc.free_mask_of(src_a)]
        later = np.unique(vacated).tolist()
        if later:  # vacated now, written by a later move: keep the engine off it
            alloc.reserve(later)
            self.reserved.update(later)
            self._reserved_mask[later] = True
