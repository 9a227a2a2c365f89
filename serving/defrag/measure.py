"""How fragmented a page_size=1 pool is: per request and for the pool's free space.

Per request: ``runs``, the number of maximal stretches of consecutive positions held by
consecutive slots (1 for a contiguous request), reported as runs per 1k tokens, and the
``leading`` run (positions ``0 .. leading-1`` sit at ``slots[0] + position``: what the kernel's
contiguous fast path reads without indices). For the pool: the largest free run and a
histogram of free-run lengths in power-of-two buckets.

Decisions:
- Runs per 1k tokens, not a 0-1 fraction: it reads the same for a 4k and a 128k request
  (a 128k request in 128 pieces and a 4k request in 4 pieces both score 1.0) and says how
  much index traffic a contiguous layout would save.
- ``RunTracker`` keeps runs and leading runs incrementally (only the slots appended since
  the last look are scanned), so the defragmenter can check every request between steps at
  the cost of the step's new tokens; ``forget`` makes it rescan a request whose slots moved.
- Pure Python and numpy (no torch): the measure runs on the host lists of the slot table.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np


def count_runs(slots: Sequence[int]) -> int:
    """Maximal runs of consecutive slots in position order (0 for no slots)."""
    if len(slots) == 0:
        return 0
    a = np.asarray(slots, dtype=np.int64)
    return 1 + int(np.count_nonzero(np.diff(a) != 1))


def leading_run(slots: Sequence[int]) -> int:
    """Length of the first run: the largest ``n`` with ``slots[p] == slots[0] + p`` for ``p < n``."""
    if len(slots) == 0:
        return 0
    a = np.asarray(slots, dtype=np.int64)
    breaks = np.flatnonzero(np.diff(a) != 1)
    return int(breaks[0]) + 1 if len(breaks) else len(a)


def runs_per_1k(runs: int, length: int) -> float:
    return 1000.0 * runs / length if length else 0.0


def free_runs(free: Iterable[int]) -> np.ndarray:
    """int64 [runs]: lengths of the maximal runs of consecutive free slots (any order in)."""
    a = np.sort(np.asarray(free, dtype=np.int64) if isinstance(free, np.ndarray) else np.fromiter(free, dtype=np.int64))
    if len(a) == 0:
        return np.zeros(0, dtype=np.int64)
    cuts = np.flatnonzero(np.diff(a) != 1) + 1
    edges = np.concatenate([[0], cuts, [len(a)]])
    return np.diff(edges)


def run_histogram(lengths: np.ndarray) -> dict[str, int]:
    """Counts of run lengths per power-of-two bucket: ``"1"``, ``"2-3"``, ``"4-7"``, ... (non-empty only)."""
    out: dict[str, int] = {}
    if len(lengths) == 0:
        return out
    buckets = np.floor(np.log2(lengths)).astype(np.int64)
    for b, n in zip(*np.unique(buckets, return_counts=True)):
        lo, hi = 1 << int(b), (1 << (int(b) + 1)) - 1
        out["1" if lo == hi else f"{lo}-{hi}"] = int(n)
    return out


@dataclass(frozen=True)
class RequestFragmentation:
    """One request: ``length`` tokens in ``runs`` runs, the first ``leading`` long."""

    req_id: int
    length: int
    runs: int
    leading: int

    @property
    def runs_per_1k(self) -> float:
        return runs_per_1k(self.runs, self.length)

    @property
    def contiguous(self) -> bool:
        return self.runs <= 1


@dataclass(frozen=True)
class PoolFragmentation:
    """The pool at one moment: every live request, the free space and its runs."""

    requests: list[RequestFragmentation]
    free_slots: int
    largest_free_run: int
    free_run_histogram: dict[str, int] = field(default_factory=dict)

    @property
    def live_tokens(self) -> int:
        return sum(r.length for r in self.requests)

    @property
    def runs(self) -> int:
        return sum(r.runs for r in self.requests)

    @property
    def runs_per_1k(self) -> float:
        """Token-weighted: all runs over all live tokens, per 1k."""
        return runs_per_1k(self.runs, self.live_tokens)

    @property
    def contiguous_requests(self) -> int:
        return sum(r.contiguous for r in self.requests)

    def summary(self) -> dict:
        """Scalars for a log line or a gate's metrics."""
        return {
            "requests": len(self.requests),
            "contiguous_requests": self.contiguous_requests,
            "live_tokens": self.live_tokens,
            "runs_per_1k": round(self.runs_per_1k, 3),
            "max_runs_per_1k": round(max((r.runs_per_1k for r in self.requests), default=0.0), 3),
            "free_slots": self.free_slots,
            "largest_free_run": self.largest_free_run,
            "free_run_histogram": dict(self.free_run_histogram),
        }


def measure(requests: dict[int, Sequence[int]], free: Iterable[int]) -> PoolFragmentation:
    """Fragmentation of live ``requests`` (id -> slots in position order) and ``free`` slots."""
    per = [RequestFragmentation(r, len(s), count_runs(s), leading_run(s)) for r, s in requests.items()]
    runs = free_runs(free)
    return PoolFragmentation(per, int(runs.sum()), int(runs.max()) if len(runs) else 0, run_histogram(runs))


def measure_pool(pool) -> PoolFragmentation:
    """``measure`` over a ``serving.kv.pool.KVPool``'s slot table and free slots
    (O(live + free slots): for reports, not every step; ``RunTracker`` is the per-step one)."""
    table = pool.table
    return measure({r: table.slots(r) for r in table.requests()}, np.flatnonzero(pool.allocator.free_mask()))


@dataclass
class _Track:
    seen: int = 0  # slots scanned so far
    runs: int = 0
    leading: int = 0
    first: int = -1
    last: int = -1


class RunTracker:
    """Runs and leading runs of every live request, kept up to date by scanning only the
    slots appended since the previous ``update``."""

    def __init__(self) -> None:
        self._tracks: dict[int, _Track] = {}

    def update(self, requests: dict[int, Sequence[int]]) -> None:
        """Catch up with ``requests`` (id -> its live slot list); forgets requests not in it."""
        for r in [r for r in self._tracks if r not in requests]:
            del self._tracks[r]
        for r, slots in requests.items():
            t = self._tracks.get(r)
            if t is None or len(slots) < t.seen:
                t = self._tracks[r] = _Track()
            n = len(slots)
            if n == t.seen:
                continue
            new = slots[t.seen :]
            if t.seen == 0:
                t.first, t.last = new[0], new[0] - 2  # the first slot opens a run
            if t.leading == t.seen:  # the leading run reached the end: extend it
                t.leading += count_leading(new, t.first + t.seen)
            t.runs += count_runs([t.last] + list(new)) - 1 if len(new) > 64 else _breaks(t.last, new)
            t.last = new[-1]
            t.seen = n

    def forget(self, req_id: int) -> None:
        """Rescan ``req_id`` on the next update (its slots moved)."""
        self._tracks.pop(req_id, None)

    def get(self, req_id: int) -> RequestFragmentation:
        t = self._tracks[req_id]
        return RequestFragmentation(req_id, t.seen, t.runs, t.leading)

    def all(self) -> list[RequestFragmentation]:
        return [self.get(r) for r in self._tracks]


def _breaks(last: int, slots: Sequence[int]) -> int:
    """Runs that ``slots`` open after a run ending at ``last`` (a short Python scan)."""
    n = 0
    for s in slots:
        n += s != last + 1
        last = s
    return n


def count_leading(slots: Sequence[int], expect: int) -> int:
    """How many of ``slots`` continue a run that expects slot ``expect`` next."""
    if len(slots) > 64:
        off = np.flatnonzero(np.asarray(slots, dtype=np.int64) - np.arange(len(slots)) != expect)
        return int(off[0]) if len(off) else len(slots)
    n = 0
    for s in slots:
        if s != expect + n:
            break
        n += 1
    return n
