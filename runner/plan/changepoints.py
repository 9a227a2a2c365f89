"""Where a metric's level moved across runs: change points of a series of runs, each a set of
samples (a single number is one sample). Pure; standard library only.

``find_changes(series, floor=..., confidence=...)`` fits a piecewise-constant model to the runs'
medians (asv's step detection does the same), then keeps a change only where the samples say
it is real.

1. **Segment.** Optimal partitioning (the exact dynamic programme PELT prunes) of the per-run
   medians under an L1 cost, ``sum |median_i - median of the segment|``, plus a penalty per
   change of ``PENALTY * s * log(n)``, where ``s`` is a robust scale of the run-to-run noise
   (the MAD of successive differences). A segment holds at least ``MIN_RUNS`` runs.
2. **Confirm.** Each change is tested between its two neighbouring segments: the two-sided
   Mann-Whitney U test (``runner.plan.ranktest``) of every sample of the runs before against
   every sample of the runs after must give ``p`` below ``(1 - confidence) / (n - 1)`` (a
   Bonferroni bound over the places a change could have been put), and the effect, the
   relative move of the segments' levels (the median of their runs' medians), must exceed
   ``floor`` (the gate's tolerance, 10% by default). The weakest change that fails is merged
   away and the rest tested again, until every change left holds.

Decisions:

- L1, not squared error: one wild run costs the same inside its segment as split off with a
  neighbour, so an outlier never buys a segment; with ``MIN_RUNS = 2`` no run is a level of its
  own. The price: a move in the newest run alone is not a change until a second run confirms it
  (``runner diff`` judges one run against another).
- The level of a segment is the median of its runs' medians, so one wild run inside a segment
  moves neither its level nor the effect.
- Samples carry their spread into the test: wide samples make a move harder to confirm. Runs of
  single numbers are one sample each; few of them confirm nothing, which is honest.
- Exact optimal partitioning costs ``O(n^2)`` segment costs (each in ``O(log n)`` with two
  heaps); ``MAX_RUNS`` bounds ``n`` (the newest runs are kept).
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from runner.plan.ranktest import mann_whitney

MIN_RUNS = 2
"""The fewest runs a level holds."""
PENALTY = 3.0
"""The cost of one more change, in units of ``scale * log(n)`` (about BIC's, made stricter)."""
MAX_RUNS = 500
"""The most runs a series is searched over (the newest)."""


@dataclass(frozen=True)
class Change:
    """A level change: run ``index`` (into the series) is the first run of the new level.

    ``before``/``after``: the levels (median of the runs' medians) of the segments on either
    side; ``relative``: ``(after - before) / |before|`` (infinite from 0); ``p_value``: the rank
    test of the samples on either side; ``runs_before``/``runs_after``: the segments' sizes."""

    index: int
    before: float
    after: float
    relative: float
    p_value: float
    runs_before: int
    runs_after: int


def find_changes(series: Sequence[Sequence[float]], *, floor: float, confidence: float = 0.95) -> list[Change]:
    """The confirmed level changes of ``series`` (runs in time order, each a non-empty list of
    finite samples), earliest first. See the module docstring."""
    runs = [list(map(float, samples)) for samples in series]
    if any(not samples or not all(math.isfinite(x) for x in samples) for samples in runs):
        raise ValueError("every run needs at least one finite sample")
    offset = max(0, len(runs) - MAX_RUNS)
    runs = runs[offset:]
    n = len(runs)
    if n < 2 * MIN_RUNS:
        return []
    medians = [statistics.median(samples) for samples in runs]
    starts = _segment(medians)
    alpha = (1 - confidence) / (n - 1)
    done: dict[tuple[int, int, int], Change] = {}  # a change's test, by its two segments' bounds
    while True:
        bounds = [*starts, n]
        tested = []
        for k in range(1, len(starts)):
            key = (bounds[k - 1], bounds[k], bounds[k + 1])
            if key not in done:
                done[key] = _test(runs, medians, *key)
            tested.append(done[key])
        weak = [change for change in tested if change.p_value >= alpha or not abs(change.relative) > floor]
        if not weak:
            return [Change(change.index + offset, change.before, change.after, change.relative, change.p_value,
                           change.runs_before, change.runs_after) for change in tested]
        weakest = max(weak, key=lambda change: (change.p_value, -abs(change.relative)))
        starts.remove(weakest.index)


def _test(runs: list[list[float]], medians: list[float], first: int, start: int, end: int) -> Change:
    """The change at run ``start`` tested between the segments ``[first, start)`` and
    ``[start, end)``."""
    left = range(first, start)
    right = range(start, end)
    before = statistics.median(medians[i] for i in left)
    after = statistics.median(medians[i] for i in right)
    p_value = mann_whitney([x for i in left for x in runs[i]], [x for i in right for x in runs[i]]).p_value
    if before == after:
        relative = 0.0
    else:
        relative = (after - before) / abs(before) if before != 0 else math.copysign(math.inf, after - before)
    return Change(start, before, after, relative, p_value, len(left), len(right))


def _segment(medians: list[float]) -> list[int]:
    """The first run of every segment of the optimal partition (``starts[0] == 0``)."""
    n = len(medians)
    cost = _l1_costs(medians)
    penalty = PENALTY * _scale(medians) * math.log(n)
    best = [0.0] + [math.inf] * n  # best[j]: the cost of runs [0, j)
    previous = [0] * (n + 1)
    for j in range(MIN_RUNS, n + 1):
        for i in [0, *range(MIN_RUNS, j - MIN_RUNS + 1)]:
            if best[i] == math.inf:
                continue
            total = best[i] + cost[i][j - 1] + (penalty if i else 0.0)
            if total < best[j]:
                best[j], previous[j] = total, i
    starts, j = [], n
    while j > 0:
        j = previous[j]
        starts.append(j)
    return sorted(starts)


def _l1_costs(values: list[float]) -> list[list[float]]:
    """``cost[i][j]``: ``sum |values[t] - median|`` over ``t`` in ``[i, j]``; two heaps keep the
    lower and upper halves of each growing segment with their sums."""
    n = len(values)
    cost = [[0.0] * n for _ in range(n)]
    for i in range(n):
        low: list[float] = []  # a max-heap (negated): the lower half, one more than high when odd
        high: list[float] = []
        low_sum = high_sum = 0.0
        for j in range(i, n):
            value = values[j]
            if low and value > -low[0]:
                heapq.heappush(high, value)
                high_sum += value
            else:
                heapq.heappush(low, -value)
                low_sum += value
            if len(low) > len(high) + 1:
                moved = -heapq.heappop(low)
                low_sum -= moved
                heapq.heappush(high, moved)
                high_sum += moved
            elif len(high) > len(low):
                moved = heapq.heappop(high)
                high_sum -= moved
                heapq.heappush(low, -moved)
                low_sum += moved
            middle = -low[0]
            cost[i][j] = (middle * len(low) - low_sum) + (high_sum - middle * len(high))
    return cost


def _scale(medians: list[float]) -> float:
    """A robust scale of the run-to-run noise: the MAD of successive differences, as a
    standard deviation of one run; a tiny positive number when they are all equal."""
    differences = [b - a for a, b in zip(medians, medians[1:])]
    centre = statistics.median(differences)
    mad = statistics.median(abs(d - centre) for d in differences)
    scale = 1.4826 * mad / math.sqrt(2)
    return scale if scale > 0 else 1e-12 * max(1.0, max(abs(m) for m in medians))
