"""The Mann-Whitney U test (Wilcoxon rank-sum): do two sets of samples differ in location?

``mann_whitney(old, new)`` gives ``U`` of ``new`` (the number of (old, new) pairs in which the
new sample is larger, ties counting one half) and the two-sided p-value of the hypothesis that
both come from one distribution. ``runner diff`` and ``runner gate --baseline`` call a change
significant when the p-value is below ``1 - confidence`` of the gate, as asv's ``compare``
does with its own test.

Decisions:

- Exact where it is cheap and exact: without ties, and with at most ``EXACT_MAX_PAIRS`` pairs,
  the null distribution of ``U`` is counted exactly (the coefficients of the Gaussian binomial
  ``[m+n choose m]_q``, in integers), and the p-value is ``2 * min(P(U <= u), P(U >= u))``,
  capped at 1. Benchmarks take tens of samples, so this is the usual case.
- With ties, up to ``EXACT_TIES_MAX_PAIRS`` pairs, the exact distribution is the permutation
  distribution of the tied (mid) ranks: the subsets of the pooled ranks of the new side's size,
  counted by their rank sum (a packed integer polynomial per subset size, so it stays fast).
  Benchmark timings tie when a clock rounds them, and the normal approximation is off by up to
  a tenth in p for the few samples where that happens.
- Beyond, the normal approximation with the tie correction of the variance and a continuity
  correction of 1/2 (scipy's ``method="asymptotic"``).
- All samples equal on both sides: no rank can tell them apart, the p-value is 1.
- No dependency: the runner stays light (no scipy); ``math.erfc`` gives the normal tail.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

EXACT_MAX_PAIRS = 5_000
"""Exact p-values for at most this many (old, new) pairs (``m * n``); the normal
approximation beyond (``m * n`` steps per sample of the smaller side)."""
EXACT_TIES_MAX_PAIRS = 2_500
"""Exact p-values with tied samples for at most this many pairs (the rank-sum count grows as
``(m + n)^3`` bits)."""


@dataclass(frozen=True)
class RankTest:
    """``u``: U of the new samples; ``p_value``: two-sided; ``method``: ``exact`` or ``normal``."""

    u: float
    p_value: float
    method: str
    old_n: int
    new_n: int


def mann_whitney(old: list[float], new: list[float]) -> RankTest:
    """The two-sided Mann-Whitney U test of ``new`` against ``old`` (finite numbers, each side
    at least one sample)."""
    m, n = len(old), len(new)
    if m == 0 or n == 0:
        raise ValueError("the rank test needs at least one sample on each side")
    ranks, tie_sizes = _ranks([*old, *new])
    u = sum(ranks[m:]) - n * (n + 1) / 2
    if all(size == m + n for size in tie_sizes):  # one value throughout
        return RankTest(u, 1.0, "exact", m, n)
    if all(size == 1 for size in tie_sizes) and m * n <= EXACT_MAX_PAIRS:
        return RankTest(u, _exact_p(int(u), m, n), "exact", m, n)
    if m * n <= EXACT_TIES_MAX_PAIRS:
        return RankTest(u, _exact_tied_p(ranks, m, n), "exact", m, n)
    return RankTest(u, _normal_p(u, m, n, tie_sizes), "normal", m, n)


def _ranks(values: list[float]) -> tuple[list[float], list[int]]:
    """The 1-based ranks of ``values`` (ties share their mean rank) and the size of each group
    of equal values."""
    order = sorted(range(len(values)), key=lambda index: values[index])
    ranks = [0.0] * len(values)
    sizes = []
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        mean_rank = (start + end) / 2 + 1
        for position in range(start, end + 1):
            ranks[order[position]] = mean_rank
        sizes.append(end - start + 1)
        start = end + 1
    return ranks, sizes


def u_counts(m: int, n: int) -> list[int]:
    """How many of the ``C(m+n, m)`` orderings of ``m`` old and ``n`` new samples (no ties)
    give each ``U = 0 .. m*n``: the coefficients of ``prod_{i=1..k} (1 - q^(j+i)) / (1 - q^i)``
    with ``k = min(m, n)``, ``j = max(m, n)``."""
    k, j = min(m, n), max(m, n)
    size = m * n + 1
    counts = [0] * size
    counts[0] = 1
    for i in range(1, k + 1):
        for degree in range(size - 1, j + i - 1, -1):  # times (1 - q^(j+i))
            counts[degree] -= counts[degree - (j + i)]
        for degree in range(i, size):  # divided by (1 - q^i): a running sum with step i
            counts[degree] += counts[degree - i]
    return counts


def _exact_p(u: int, m: int, n: int) -> float:
    counts = u_counts(m, n)
    total = sum(counts)
    below = sum(counts[: u + 1])
    above = sum(counts[u:])
    return float(min(Fraction(1), Fraction(2 * min(below, above), total)))


def _exact_tied_p(ranks: list[float], m: int, n: int) -> float:
    """The two-sided p-value of the new side's rank sum among every choice of ``n`` of the
    pooled (mid) ranks. Doubled ranks are whole numbers; ``counts[k]`` packs, for each sum
    ``s``, how many ``k``-subsets of the ranks seen so far sum to ``s``, ``width`` bits each."""
    doubled = [int(2 * rank) for rank in ranks]
    width = 8 * ((m + n) // 8 + 1)  # a count is below 2^(m+n), so it never spills over
    counts = [1] + [0] * n
    for rank in doubled:
        for k in range(n, 0, -1):
            counts[k] += counts[k - 1] << (rank * width)
    observed = sum(doubled[m:])
    packed = counts[n].to_bytes((max(doubled) * n + 1) * width // 8, "little")
    step = width // 8
    by_sum = [int.from_bytes(packed[s * step:(s + 1) * step], "little") for s in range(len(packed) // step)]
    total = math.comb(m + n, n)
    below = sum(by_sum[: observed + 1])
    above = total - below + by_sum[observed]
    return float(min(Fraction(1), Fraction(2 * min(below, above), total)))


def _normal_p(u: float, m: int, n: int, tie_sizes: list[int]) -> float:
    total = m + n
    ties = sum(size**3 - size for size in tie_sizes)
    variance = m * n / 12 * ((total + 1) - ties / (total * (total - 1)))
    if variance <= 0:
        return 1.0
    distance = max(abs(u - m * n / 2) - 0.5, 0.0)
    return min(1.0, math.erfc(distance / math.sqrt(2 * variance)))
