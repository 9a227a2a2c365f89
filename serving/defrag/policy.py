"""When to compact and how much per step: the defragmenter the engine calls between steps.

``Defragmenter(pool, policy)`` is a callable for ``Engine.between_steps``: after every step it
catches up with the slot table (``RunTracker``: only the new slots are scanned), and either
continues the compaction in progress by one budget of moves or, when some request is too
fragmented, plans a new one (``plan_compaction``) and starts it (``Compaction``).

Decisions:
- Trigger per request, like llama.cpp's ``defrag_thold`` but in runs per 1k tokens: a request of
  at least ``min_tokens`` tokens in at least ``min_runs`` runs with more than ``threshold`` runs
  per 1k is selected; the others keep their leading run in place. A compaction starts when any
  request is selected; a plan that moves nothing (or would reserve too much) backs off for
  ``backoff_checks`` steps, so a pool that cannot improve is not re-planned every step.
- A per-step budget bounds one step's added latency: at most ``budget_bytes`` (rows x every
  layer, read once and written once) and ``max_moves`` moves (the host bookkeeping is Python,
  vectorized where it can be: 4.8 µs per move on the H200's host, so about 4.6 ms for a full
  954-move piece of DeepSeek-V3's 61 layers), at least one move. A compaction larger than that runs
  over the following steps; its destinations are reserved meanwhile, and it starts only when
  that reservation leaves at least ``1 - max_reserved_fraction`` of the free slots to the engine.
- A piece's copy is a replay of one captured launch (``RowMover``, sized for ``max_moves``): a
  Triton launch costs tens of microseconds of host time, during which the GPU waits.
- Only between steps: the engine calls it after ``step`` returned (nothing in flight, no graph
  being replayed). A captured step rebuilds ``kv_indices`` from the slot table on the device
  every replay, and the attention plan is made per step from host lengths, so nothing captured
  holds a slot that compaction moved.
- Each placed request gets a growth reserve (``reserve_fraction`` of its length, at least
  ``min_reserve`` slots) so the next compaction moves only the tokens it appended.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import numpy as np

from serving.defrag.executor import Compaction, RowMover, warm_up_copy
from serving.defrag.measure import RunTracker, measure_pool
from serving.defrag.planner import MovePlan, plan_compaction
from serving.kv.pool import KVPool


@dataclass(frozen=True)
class DefragPolicy:
    """threshold: runs per 1k tokens above which a request is compacted. min_tokens, min_runs:
    requests shorter, or in fewer runs, are left alone (a compaction is planned over the whole
    pool: not worth it for a few stray tokens). budget_bytes, max_moves: per step (see the module docstring).
    reserve_fraction, min_reserve: growth room claimed after each compacted request.
    max_reserved_fraction: the most of the free slots a compaction may reserve.
    backoff_checks: checks to wait after a plan that moved nothing or was skipped."""

    threshold: float = 4.0
    min_tokens: int = 256
    min_runs: int = 16
    budget_bytes: int = 128 << 20
    max_moves: int = 4096
    reserve_fraction: float = 0.02
    min_reserve: int = 64
    max_reserved_fraction: float = 0.5
    backoff_checks: int = 32

    def __post_init__(self) -> None:
        if self.threshold < 0 or min(self.min_tokens, self.min_runs, self.budget_bytes, self.max_moves) < 1:
            raise ValueError(f"Expected threshold >= 0 and positive min_tokens, min_runs, budget_bytes, max_moves, got {self}")
        if not 0 < self.max_reserved_fraction <= 1 or self.reserve_fraction < 0 or self.min_reserve < 0:
            raise ValueError(f"Expected 0 < max_reserved_fraction <= 1 and non-negative reserves, got {self}")

    def reserve(self, length: int) -> int:
        return max(self.min_reserve, math.ceil(self.reserve_fraction * length))


@dataclass
class DefragStats:
    """Counts since the defragmenter was made: checks (between-steps calls), compactions
    started, completed and skipped (reservation too large), steps that moved rows, rows moved
    and bytes (read + written), moves dropped, requests deferred, host seconds (planning, moves)."""

    checks: int = 0
    compactions: int = 0
    completed: int = 0
    skipped: int = 0
    steps_moving: int = 0
    moved_rows: int = 0
    moved_bytes: int = 0
    dropped_moves: int = 0
    deferred_requests: int = 0
    plan_s: float = 0.0
    move_s: float = 0.0


class Defragmenter:
    """Incremental compaction of ``pool`` between engine steps (``engine.between_steps``).

    enabled: False measures fragmentation only. copy: the executor's device copy ("auto",
    "triton", "torch").
    """

    def __init__(self, pool: KVPool, policy: DefragPolicy | None = None, *, enabled: bool = True, copy: str = "auto") -> None:
        self.pool = pool
        self.policy = policy or DefragPolicy()
        self.enabled = enabled
        self.copy = copy
        self.tracker = RunTracker()
        self.stats = DefragStats()
        self.active: Compaction | None = None
        self._moving: set[int] = set()  # requests of the active plan (their runs are stale)
        self._wait = 0  # checks to skip before planning again
        self.row_bytes = pool.kv.shape[0] * pool.kv.shape[2] * pool.kv.element_size()
        self.mover: RowMover | None = None
        if enabled and copy in ("auto", "triton"):
            warm_up_copy(pool.kv)  # the first compaction, mid-serving, must not pay a compile
            if pool.kv.is_cuda:  # a piece's copy as one graph replay, not a Triton launch
                self.mover = RowMover(pool.kv, self.max_moves)

    def __call__(self, engine=None) -> None:
        self.between_steps()

    @property
    def max_moves(self) -> int:
        return max(1, min(self.policy.max_moves, self.policy.budget_bytes // (2 * self.row_bytes)))

    def _live(self) -> dict[int, list[int]]:
        table = self.pool.table
        return {r: table.slots(r) for r in table.requests()}

    def selected(self) -> list[int]:
        """Requests over the threshold (after catching up with the table)."""
        self.tracker.update(self._live())
        p = self.policy
        return [f.req_id for f in self.tracker.all()
                if f.length >= p.min_tokens and f.runs >= p.min_runs and f.runs_per_1k > p.threshold]

    def between_steps(self) -> None:
        """One call between engine steps: continue or start a compaction, one budget of moves."""
        self.stats.checks += 1
        if not self.pool.table.requests():
            self.cancel()
            return
        if not self.enabled:
            return
        if self.active is None:
            if self._wait > 0:
                self._wait -= 1
                return
            chosen = self.selected()
            if not chosen:
                return
            if self.start(chosen) is None:
                self._wait = self.policy.backoff_checks
                return
        self._advance(self.max_moves)

    def start(self, select: list[int] | None = None) -> Compaction | None:
        """Plan a compaction of ``select`` (None: every non-contiguous request) and reserve its
        destinations; None (nothing started) when it would move nothing or reserve too much."""
        if self.active is not None:
            raise RuntimeError("Expected no compaction in progress, got one (finish or cancel it first)")
        t0 = time.perf_counter()
        alloc = self.pool.allocator
        free_mask = alloc.free_mask()
        plan: MovePlan = plan_compaction(self._live(), np.flatnonzero(free_mask), self.pool.num_slots, select=select,
                                         reserve=self.policy.reserve)
        self.stats.plan_s += time.perf_counter() - t0
        self.stats.deferred_requests += len(plan.deferred)
        if plan.num_moves == 0:
            return None
        reserve = len(plan.initially_free_destinations(free_mask))
        if reserve > self.policy.max_reserved_fraction * alloc.num_free:
            self.stats.skipped += 1
            return None
        self.active = Compaction(self.pool, plan, copy=self.copy, mover=self.mover)
        self._moving = set(plan.targets) | {int(r) for r in set(plan.req.tolist())}
        self.stats.compactions += 1
        return self.active

    def _advance(self, max_moves: int | None) -> None:
        c = self.active
        t0 = time.perf_counter()
        before = (c.stats.applied, c.stats.dropped)
        moved = c.step(max_moves)
        self.stats.move_s += time.perf_counter() - t0
        self.stats.moved_rows += moved
        self.stats.moved_bytes += 2 * moved * self.row_bytes
        self.stats.dropped_moves += c.stats.dropped - before[1]
        self.stats.steps_moving += moved > 0
        if c.done:
            self.stats.completed += 1
            self._finish()

    def compact(self, select: list[int] | None = None, max_moves: int | None = None) -> int:
        """A whole compaction now (finishing any in progress first); returns the rows moved.
        ``max_moves``: moves per piece batch (None: all at once)."""
        moved = self.stats.moved_rows
        if self.active is None and self.start(select) is None:
            return 0
        while self.active is not None:
            self._advance(max_moves)
        return self.stats.moved_rows - moved

    def cancel(self) -> None:
        """Stop the compaction in progress (rows moved so far stay moved; reservations return)."""
        if self.active is not None:
            self.active.cancel()
            self._finish()

    def _finish(self) -> None:
        self.active = None
        self._forget(self._moving)
        self._moving = set()

    def _forget(self, requests) -> None:
        for r in requests:
            self.tracker.forget(r)

    @property
    def reserved_slots(self) -> int:
        """Slots the compaction in progress holds (allocated to no request until it moves rows there)."""
        return len(self.active.reserved) if self.active is not None else 0

    def summary(self) -> dict:
        """The counters plus the pool's fragmentation now (``measure_pool``: O(live + free))."""
        out = asdict(self.stats)
        out.update(enabled=self.enabled, in_progress=self.active is not None, reserved_slots=self.reserved_slots)
        out["fragmentation"] = measure_pool(self.pool).summary()
        return out
