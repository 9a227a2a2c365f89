"""Compaction planning: the row moves that make each selected request contiguous in position
order (position p at slot ``start + p``), moving as few rows as possible. Pure: numpy over the
slot table's host lists and the free slots; no torch, no device.

The problem. Request r with slots s_0 .. s_{L-1} placed at start S keeps in place the rows
with ``s_p - p == S`` and moves the rest; ranges of different requests must not overlap, nor
cover rows that must stay (another request's contiguous prefix, slots allocated to nobody).
Choosing one range per request to maximise the rows kept is interval scheduling with a
choice of intervals per job (weighted job interval selection), NP-hard in general.

Decisions:
- Candidates and greedy order (the classic heuristic for weighted interval selection: heaviest
  first). A request's candidate starts are its most frequent offsets ``s_p - p`` (the mode
  keeps the most rows; a request grown from a few prefill runs has one dominant offset), and
  requests are placed in decreasing order of the rows their best offset keeps, so the big
  in-place runs are claimed first. A candidate's score is the rows it keeps, minus the rows
  kept by every not-yet-placed request whose best range it overlaps (covering even one slot of
  that range forces that request to move everything), minus the loose rows of unselected
  requests it covers (each then evicted). When no candidate offset fits, a vectorized
  sliding-window search over the pool takes the feasible start with the best score (lowest
  start on ties: first fit, which keeps the large free runs at the end of the pool). A request
  with no feasible range is deferred (left as it is) and counted.
- Growth reserve (``reserve``): a placed request also claims slots after its range (free or
  not; nobody else is placed there), so the tokens it appends before the next compaction can
  be moved into them instead of moving the whole request. Soft: taken when it fits and scores
  as well as the range alone (it covers no other request's best range).
- Unselected requests are pinned by their leading run (the contiguous prefix the kernel's fast
  path reads, an obstacle nobody may cover); their loose rows after it may be evicted from a
  claimed range to a free slot outside every claimed range, one move each.
- Order: a move must wait for the move that vacates its destination. Moves form chains
  (ending at a free slot) and cycles. Chains are ordered by their depth from the free end
  (list ranking by pointer jumping, vectorized: a chain can be 100k moves long), so every
  move's destination is free or vacated before it is written; each row moves at most once.
  A cycle is broken through a free slot (one extra move per cycle) and emitted first, as many
  cycles at once as there are free slots; without any free slot in the pool, its requests
  stay incomplete.
- The order is valid for the executor's chunked, simultaneous application: a chunk may be cut
  anywhere; within a chunk, ``split_waves`` cuts where a row written in the chunk would be read
  again (only a cycle's temporary slot), and each wave reads every source before it writes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

FREE = -1
BLOCKED = -2  # slot 0, and slots allocated to no request: never read, never written
_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass
class MovePlan:
    """Moves in execution order: move i takes request ``req[i]``'s row at position ``pos[i]``
    from slot ``src[i]`` to slot ``dst[i]`` (int64 arrays [M]).

    targets: request id -> first slot of its contiguous range. deferred: selected requests
    left as they are (no room). incomplete: placed requests left in a cycle that could not be
    broken (no free slot). kept: rows of placed requests already in place. evictions: moves of
    unselected or deferred requests' rows out of claimed ranges. temp_moves: extra moves that
    broke cycles. lower_bound: rows that must move for every selected request to sit at its best
    offset (sum of L - keep), a floor for ``num_moves`` when nothing conflicts.
    """

    req: np.ndarray = field(default_factory=lambda: _EMPTY)
    pos: np.ndarray = field(default_factory=lambda: _EMPTY)
    src: np.ndarray = field(default_factory=lambda: _EMPTY)
    dst: np.ndarray = field(default_factory=lambda: _EMPTY)
    targets: dict[int, int] = field(default_factory=dict)
    deferred: list[int] = field(default_factory=list)
    incomplete: list[int] = field(default_factory=list)
    kept: int = 0
    evictions: int = 0
    temp_moves: int = 0
    lower_bound: int = 0

    @property
    def num_moves(self) -> int:
        return len(self.src)

    def initially_free_destinations(self, free_mask: np.ndarray) -> np.ndarray:
        """Destinations free before the plan runs (what an executor reserves), from the pool's
        bool [num_slots] free mask; sorted int64."""
        return np.unique(self.dst[free_mask[self.dst]])


def split_waves(src: np.ndarray, dst: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) pieces of a chunk of moves that can each be applied at once (every source
    read before any destination is written): a piece ends before a move whose source an
    earlier move of the piece wrote."""
    pieces, start, written = [], 0, set()
    for i, (s, d) in enumerate(zip(src.tolist(), dst.tolist())):
        if s in written:
            pieces.append((start, i))
            start, written = i, set()
        written.add(d)
    if start < len(src):
        pieces.append((start, len(src)))
    return pieces


def plan_compaction(
    requests: Mapping[int, Sequence[int]],
    free: Iterable[int],
    num_slots: int,
    *,
    select: Iterable[int] | None = None,
    reserve: int | Callable[[int], int] = 0,
    candidates: int = 8,
) -> MovePlan:
    """The moves that make every selected request contiguous (see the module docstring).

    requests: every live request, id -> its slots in position order. free: the free slots
    (any iterable; an int array is taken as is, e.g. ``np.flatnonzero(allocator.free_mask())``).
    num_slots: the pool's size (slot 0 is never used). select: the requests to compact
    (None: every request that is not contiguous); the others keep their leading run in place.
    reserve: slots to keep clear after a placed request of L tokens (an int or ``f(L)``).
    candidates: offsets tried per request before the sliding-window search.
    Raises ValueError when a slot is out of range, owned twice, or both owned and free.
    """
    ids = list(requests)
    rows = [np.asarray(requests[r], dtype=np.int64).reshape(-1) for r in ids]
    free_arr = np.asarray(free, dtype=np.int64).reshape(-1) if isinstance(free, np.ndarray) else \
        np.fromiter((int(s) for s in free), dtype=np.int64)
    owner = _owners(rows, free_arr, num_slots)
    chosen = set(ids) if select is None else set(select)
    reserve_of = reserve if callable(reserve) else (lambda _length, g=int(reserve): g)

    obstacle = owner == BLOCKED
    loose = np.zeros(num_slots, dtype=bool)
    offsets: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # index -> (offsets by count desc, counts)
    selected = []
    for i, a in enumerate(rows):
        off = a - np.arange(len(a))
        if ids[i] in chosen and len(a) and np.any(off != off[0]):
            uniq, cnt = np.unique(off, return_counts=True)
            order = np.lexsort((uniq, -cnt))
            offsets[i] = (uniq[order], cnt[order])
            selected.append(i)
        else:  # pinned: the leading run stays, later rows may be evicted
            lead = len(a) if not len(a) else int(np.argmax(np.append(off != off[0], True)))
            obstacle[a[:lead]] = True
            loose[a[lead:]] = True
    cum_loose = np.concatenate([[0], np.cumsum(loose)])
    conflicts = _Conflicts({i: (int(offsets[i][0][0]), len(rows[i]), int(offsets[i][1][0])) for i in selected},
                           obstacle, num_slots)

    bad = obstacle.copy()  # no range may cover these: pinned prefixes, blocked, claimed so far
    holes = _Holes(bad)  # the maximal runs of slots a range may still cover
    claimed = np.zeros(num_slots, dtype=bool)  # the placed ranges themselves (reserves excluded)
    targets: dict[int, int] = {}
    deferred: list[int] = []
    selected.sort(key=lambda i: (-int(offsets[i][1][0]), -len(rows[i]), i))
    for i in selected:
        length = len(rows[i])
        conflicts.remove(i)
        scorer = _Scorer(offsets[i], conflicts, cum_loose, length)
        widths = sorted({length + reserve_of(length), length}, reverse=True)
        best = max((c for w in widths for c in _candidates(scorer, holes, w, candidates)), default=None)
        if best is None:
            best = max((c for w in widths for c in _best_window(scorer, holes, w)), default=None)
        if best is None:
            deferred.append(i)
            continue
        _, width, neg_start = best
        start = -neg_start
        bad[start : start + width] = True
        holes.claim(start, width)
        claimed[start : start + length] = True
        targets[i] = start

    plan = MovePlan(targets={ids[i]: s for i, s in targets.items()}, deferred=[ids[i] for i in deferred])
    plan.lower_bound = int(sum(len(rows[i]) - offsets[i][1][0] for i in selected))
    parts = []
    for i, start in targets.items():
        target = start + np.arange(len(rows[i]))
        moving = np.flatnonzero(rows[i] != target)
        plan.kept += len(rows[i]) - len(moving)
        parts.append((np.full(len(moving), i), moving, rows[i][moving], target[moving]))
    evict = [(i, np.flatnonzero(claimed[a])) for i, a in enumerate(rows) if i not in targets]
    evict = [(i, p) for i, p in evict if len(p)]
    n_evict = sum(len(p) for _, p in evict)
    if n_evict:
        placed = np.zeros(len(rows) + 2, dtype=bool)  # indexed by owner + 2 (FREE, BLOCKED first)
        placed[[i + 2 for i in targets]] = True
        spots = _eviction_slots(owner, placed, claimed, bad & ~obstacle & ~claimed, n_evict)
        at = 0
        for i, p in evict:
            parts.append((np.full(len(p), i), p, rows[i][p], spots[at : at + len(p)]))
            at += len(p)
        plan.evictions = n_evict
    if parts:
        idx, pos, src, dst = (np.concatenate(x).astype(np.int64) for x in zip(*parts))
        _order(plan, np.asarray(ids, dtype=np.int64)[idx], pos, src, dst, owner, free_arr, num_slots)
    return plan


def _owners(rows: list[np.ndarray], free: np.ndarray, num_slots: int) -> np.ndarray:
    """int64 [num_slots]: the index of the request owning each slot, FREE or BLOCKED."""
    owned = np.concatenate(rows) if rows else _EMPTY
    every = np.concatenate([owned, free])
    if len(every) and (every.min() < 1 or every.max() >= num_slots):
        raise ValueError(f"Expected slots in [1, {num_slots - 1}], got {int(every.min())}..{int(every.max())}")
    if len(every) and np.bincount(every, minlength=num_slots).max() > 1:
        twice = int(np.flatnonzero(np.bincount(every, minlength=num_slots) > 1)[0])
        raise ValueError(f"Expected each slot owned once or free, got slot {twice} twice")
    owner = np.full(num_slots, BLOCKED, dtype=np.int64)
    owner[free] = FREE
    for i, a in enumerate(rows):
        owner[a] = i
    return owner


class _Conflicts:
    """The best ranges of the selected requests not placed yet, weighted by the rows each
    keeps there: a range that overlaps one forces that request to move all of them. A best
    range out of the pool or over an obstacle weighs nothing (it cannot be taken anyway)."""

    def __init__(self, modes: dict[int, tuple[int, int, int]], obstacle: np.ndarray, num_slots: int) -> None:
        self.ranges = {}
        for i, (start, length, keep) in modes.items():
            ok = 1 <= start and start + length <= num_slots and not obstacle[start : start + length].any()
            self.ranges[i] = (start, start + length, keep if ok else 0)
        self._sorted = None

    def remove(self, i: int) -> None:
        self.ranges.pop(i, None)
        self._sorted = None

    def bounds(self) -> np.ndarray:
        """int64 [ranges, 2]: (start, end) of each range still weighed."""
        return np.asarray([r[:2] for r in self.ranges.values()], dtype=np.int64).reshape(-1, 2)

    def cost(self, starts: np.ndarray, width: int) -> np.ndarray:
        """int64 [len(starts)]: rows kept by the ranges that [start, start + width) overlaps."""
        if self._sorted is None:
            r = np.asarray(list(self.ranges.values()), dtype=np.int64).reshape(-1, 3)
            by_end, by_start = np.argsort(r[:, 1]), np.argsort(r[:, 0])
            self._sorted = (r[by_end, 1], np.concatenate([[0], np.cumsum(r[by_end, 2])]),
                            r[by_start, 0], np.concatenate([[0], np.cumsum(r[by_start, 2])]))
        ends, w_by_end, begins, w_by_start = self._sorted
        total = w_by_end[-1]
        before = w_by_end[np.searchsorted(ends, starts, side="right")]  # ranges ending at or before start
        after = total - w_by_start[np.searchsorted(begins, starts + width, side="left")]  # starting at or after the end
        return total - before - after


class _Scorer:
    """Score of placing one request at start S over ``width`` slots: rows it keeps, minus the
    rows the ranges it overlaps would keep, minus loose rows it must evict."""

    def __init__(self, offsets, conflicts: _Conflicts, cum_loose, length):
        self.uniq_by_count, self.counts = offsets
        order = np.argsort(self.uniq_by_count)
        self.uniq, self.uniq_counts = self.uniq_by_count[order], self.counts[order]
        self.conflicts, self.cl, self.length = conflicts, cum_loose, length

    def keep(self, starts: np.ndarray) -> np.ndarray:
        at = np.clip(np.searchsorted(self.uniq, starts), 0, len(self.uniq) - 1)
        return np.where(self.uniq[at] == starts, self.uniq_counts[at], 0)

    def score(self, starts: np.ndarray, width: int) -> np.ndarray:
        ends = starts + self.length
        return self.keep(starts) - self.conflicts.cost(starts, width) - (self.cl[ends] - self.cl[starts])


class _Holes:
    """The maximal runs of slots no range covers yet (nothing ``bad``), as sorted start / end
    arrays; a claim splits the run it lies in."""

    def __init__(self, bad: np.ndarray) -> None:
        edges = np.diff(np.concatenate([[0], (~bad).astype(np.int8), [0]]))
        self.starts, self.ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)

    def fits(self, starts: np.ndarray, width: int) -> np.ndarray:
        """bool [len(starts)]: whether [start, start + width) lies inside one run."""
        if not len(self.starts):
            return np.zeros(len(starts), dtype=bool)
        at = np.searchsorted(self.starts, starts, side="right") - 1
        return (at >= 0) & (self.ends[np.maximum(at, 0)] >= starts + width) & (starts >= 1)

    def claim(self, start: int, width: int) -> None:
        at = int(np.searchsorted(self.starts, start, side="right")) - 1
        lo, hi = int(self.starts[at]), int(self.ends[at])
        keep = [(a, b) for a, b in ((lo, start), (start + width, hi)) if b > a]
        self.starts = np.concatenate([self.starts[:at], [a for a, _ in keep], self.starts[at + 1 :]]).astype(np.int64)
        self.ends = np.concatenate([self.ends[:at], [b for _, b in keep], self.ends[at + 1 :]]).astype(np.int64)


def _candidates(scorer: _Scorer, holes: _Holes, width: int, candidates: int) -> list[tuple]:
    """(score, width, -start) of the request's most frequent offsets whose ``width`` slots fit:
    ``max`` picks the best score, then the reserve, then the lowest start."""
    starts = scorer.uniq_by_count[:candidates]
    starts = starts[holes.fits(starts, width)]
    return [(int(v), width, -int(s)) for v, s in zip(scorer.score(starts, width), starts)]


def _best_window(scorer: _Scorer, holes: _Holes, width: int) -> list[tuple]:
    """The best-scoring placement of ``width`` slots anywhere they fit (lowest start on ties),
    as ``_candidates`` gives them; [] when none fits. Scores change only where a range keeps
    rows or a conflicting range begins or ends, so the starts tried are: each run's two ends,
    every offset of the request, and the slots just past or just before each conflicting range."""
    room = holes.ends - holes.starts >= width
    if not room.any():
        return []
    ranges = scorer.conflicts.bounds()
    starts = np.unique(np.concatenate([holes.starts[room], holes.ends[room] - width, scorer.uniq,
                                       ranges[:, 1], ranges[:, 0] - width]))
    starts = starts[holes.fits(starts, width)]
    if not len(starts):
        return []
    scores = scorer.score(starts, width)
    at = int(np.argmax(scores))
    return [(int(scores[at]), width, -int(starts[at]))]


def _eviction_slots(owner, placed_by_owner, claimed, reserves, count) -> np.ndarray:
    """``count`` slots outside every claimed range that are empty once the plan ran: free
    slots first (outside reserves, then inside), then slots a placed request vacates."""
    vacated = placed_by_owner[owner + 2] & ~claimed
    free = (owner == FREE) & ~claimed
    order = [free & ~reserves, free & reserves, vacated & ~reserves, vacated & reserves]
    spots = np.concatenate([np.flatnonzero(m) for m in order])[:count]
    if len(spots) < count:  # cannot happen while live rows fit in the pool
        raise RuntimeError(f"no room to evict {count} rows out of claimed ranges")
    return spots


def _order(plan: MovePlan, req, pos, src, dst, owner, free, num_slots) -> None:
    """Fill ``plan``'s move arrays in a valid order: cycles first (through a free slot), then
    chains by depth from their free end."""
    m = len(src)
    mover = np.full(num_slots, -1, dtype=np.int64)
    mover[src] = np.arange(m)
    pred = mover[dst]  # the move that vacates my destination, or -1: it is free
    assert np.all((pred >= 0) | (owner[dst] == FREE)), "a destination holds a row that stays"
    depth, nxt = (pred >= 0).astype(np.int64), pred.copy()
    for _ in range(m.bit_length() + 1):  # pointer jumping: 2^k steps per round
        has = nxt >= 0
        if not has.any():
            break
        new_depth = depth.copy()
        new_depth[has] += depth[nxt[has]]
        new_nxt = nxt.copy()
        new_nxt[has] = nxt[nxt[has]]
        depth, nxt = new_depth, new_nxt
    in_cycle = nxt >= 0
    chain = np.flatnonzero(~in_cycle)
    chain = chain[np.argsort(depth[chain], kind="stable")]
    cycle_order = np.zeros((0, 3), dtype=np.int64)
    if in_cycle.any():
        if len(free):
            cycle_order = _cycle_moves(np.flatnonzero(in_cycle), pred, np.sort(free))
            plan.temp_moves = len(cycle_order) - int(in_cycle.sum())
        else:  # no slot to break cycles with: those rows stay
            plan.incomplete = sorted({int(r) for r in req[in_cycle]})
    order = np.concatenate([cycle_order[:, 0], chain]) if len(cycle_order) else chain
    plan.req, plan.pos, plan.src, plan.dst = req[order], pos[order], src[order].copy(), dst[order].copy()
    if len(cycle_order):  # the temporary hops: out of a cycle's first source, back into its destination
        out, back = np.flatnonzero(cycle_order[:, 2] == _HOP_OUT), np.flatnonzero(cycle_order[:, 2] == _HOP_BACK)
        plan.dst[out] = cycle_order[out, 1]
        plan.src[back] = cycle_order[back, 1]


_BODY, _HOP_OUT, _HOP_BACK = 0, 1, 2


def _cycle_moves(members: np.ndarray, pred: np.ndarray, temps: np.ndarray) -> np.ndarray:
    """int64 [moves + cycles, 3]: (move index, temp slot, kind) rows breaking every cycle
    through a free slot. Per cycle: its first move's row goes out to a temp slot (``_HOP_OUT``),
    then each move whose destination was just vacated (``pred`` backwards, ``_BODY``), then the
    row comes back from the temp slot to its destination (``_HOP_BACK``). Cycles go in groups
    of as many as there are temp slots: all hops out of a group, then its bodies and hops back
    together with the next group's hops out, so the whole lot is one piece per group plus one."""
    want = {int(pred[m]): int(m) for m in members}  # move p vacates a slot that move want[p] fills
    seen: set[int] = set()
    cycles = []
    for m0 in members.tolist():
        if m0 in seen:
            continue
        body, cur = [], want[m0]
        seen.add(m0)
        while cur != m0:
            body.append(cur)
            seen.add(cur)
            cur = want[cur]
        cycles.append((m0, body))
    rows = []
    group = len(temps)
    for g0 in range(0, len(cycles), group):
        batch = list(zip(cycles[g0 : g0 + group], temps.tolist()))
        if g0 == 0:
            rows += [(m0, t, _HOP_OUT) for (m0, _), t in batch]
        for (m0, body), t in batch:
            rows += [(m, -1, _BODY) for m in body] + [(m0, t, _HOP_BACK)]
        rows += [(m0, t, _HOP_OUT) for (m0, _), t in zip(cycles[g0 + group : g0 + 2 * group], temps.tolist())]
    return np.asarray(rows, dtype=np.int64).reshape(-1, 3)


def simulate(plan: MovePlan, requests: Mapping[int, Sequence[int]], free: Iterable[int],
             chunk: int | None = None) -> tuple[dict[int, list[int]], set[int]]:
    """Apply ``plan`` to host copies as an executor would (``chunk`` moves at a time, each
    chunk in ``split_waves`` pieces applied at once) and return (requests, free slots).
    Raises AssertionError when a piece reads a slot that does not hold the planned row or
    writes a slot that is neither free nor vacated by the same piece."""
    slots = {r: list(s) for r, s in requests.items()}
    free_set = {int(s) for s in free}
    holder = {s: (r, p) for r, ss in slots.items() for p, s in enumerate(ss)}
    step = chunk or max(1, plan.num_moves)
    for c0 in range(0, plan.num_moves, step):
        c1 = min(plan.num_moves, c0 + step)
        for w0, w1 in split_waves(plan.src[c0:c1], plan.dst[c0:c1]):
            piece = range(c0 + w0, c0 + w1)
            srcs = [int(plan.src[i]) for i in piece]
            reads = {}
            for i, s in zip(piece, srcs):
                r, p = int(plan.req[i]), int(plan.pos[i])
                assert holder.get(s) == (r, p) and slots[r][p] == s, f"move {i} reads slot {s}, not ({r}, {p})"
                reads[s] = holder[s]
            dsts = [int(plan.dst[i]) for i in piece]
            assert len(set(dsts)) == len(dsts), "a piece writes one slot twice"
            for d in dsts:
                assert d in free_set or d in reads, f"slot {d} is written while it holds a row"
            for s in srcs:
                del holder[s]
                free_set.add(s)
            for i, d in zip(piece, dsts):
                r, p = int(plan.req[i]), int(plan.pos[i])
                free_set.discard(d)
                holder[d] = (r, p)
                slots[r][p] = d
    return slots, free_set
