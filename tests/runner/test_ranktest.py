"""The Mann-Whitney U test against published values and a brute-force permutation oracle."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from runner.plan.ranktest import EXACT_MAX_PAIRS, mann_whitney, u_counts


def permutation_p(old: list[float], new: list[float]) -> float:
    """The oracle: every way to split the pooled samples into |old| and |new|, counted; the
    two-sided p-value as ``2 * min(P(U <= u), P(U >= u))`` over those splits (ties included)."""
    pooled = [*old, *new]
    m = len(old)

    def u_of(new_side: list[float], old_side: list[float]) -> float:
        return sum((b > a) + 0.5 * (b == a) for a in old_side for b in new_side)

    observed = u_of(new, old)
    splits = [u_of([pooled[i] for i in range(len(pooled)) if i not in chosen], [pooled[i] for i in chosen])
              for chosen in map(set, itertools.combinations(range(len(pooled)), m))]
    below = sum(u <= observed + 1e-9 for u in splits) / len(splits)
    above = sum(u >= observed - 1e-9 for u in splits) / len(splits)
    return min(1.0, 2 * min(below, above))


def test_published_example_exact_and_normal():
    # scipy.stats.mannwhitneyu's documented example (Conover): U = 17, exact p 1/9,
    # asymptotic (continuity-corrected) p 0.11134688653314041
    males, females = [20, 11, 17, 12], [19, 22, 16, 29, 24]
    test = mann_whitney(males, females)
    assert test.u == 17 and test.method == "exact"
    assert test.p_value == pytest.approx(1 / 9, abs=1e-12)


def test_normal_approximation_matches_the_published_asymptotic_value(monkeypatch):
    monkeypatch.setattr("runner.plan.ranktest.EXACT_MAX_PAIRS", 0)
    monkeypatch.setattr("runner.plan.ranktest.EXACT_TIES_MAX_PAIRS", 0)
    test = mann_whitney([20, 11, 17, 12], [19, 22, 16, 29, 24])
    assert test.method == "normal"
    assert test.p_value == pytest.approx(0.11134688653314041, rel=1e-9)


@pytest.mark.parametrize(("m", "n"), [(1, 1), (1, 5), (3, 4), (5, 5), (4, 7)])
def test_u_counts_are_the_counted_orderings(m, n):
    counts = [0] * (m * n + 1)
    for chosen in itertools.combinations(range(m + n), m):  # positions of old samples, values 0..m+n-1
        new = [v for v in range(m + n) if v not in chosen]
        counts[sum(b > a for a in chosen for b in new)] += 1
    assert u_counts(m, n) == counts
    assert sum(u_counts(m, n)) == math.comb(m + n, m)


def test_exact_p_equals_the_permutation_oracle_without_ties():
    draw = random.Random(7)
    for _ in range(40):
        m, n = draw.randint(1, 6), draw.randint(1, 6)
        values = draw.sample(range(1000), m + n)
        old, new = values[:m], values[m:]
        test = mann_whitney(old, new)
        assert test.method == "exact"
        assert test.p_value == pytest.approx(permutation_p(old, new), abs=1e-12), (old, new)


def test_exact_p_with_ties_equals_the_permutation_oracle():
    draw = random.Random(11)
    for _ in range(30):
        m, n = draw.randint(1, 7), draw.randint(1, 7)
        old = [draw.randint(0, 4) * 0.5 for _ in range(m)]
        new = [draw.randint(1, 5) * 0.5 for _ in range(n)]
        test = mann_whitney(old, new)
        assert test.method == "exact"
        assert test.p_value == pytest.approx(permutation_p(old, new), abs=1e-12), (old, new)


def test_normal_with_ties_tracks_the_permutation_oracle(monkeypatch):
    monkeypatch.setattr("runner.plan.ranktest.EXACT_TIES_MAX_PAIRS", 0)
    draw = random.Random(13)
    worst = 0.0
    for _ in range(20):
        old = [draw.randint(0, 6) for _ in range(7)]
        new = [draw.randint(1, 7) for _ in range(7)]
        test = mann_whitney(old, new)
        assert test.method == "normal"
        worst = max(worst, abs(test.p_value - permutation_p(old, new)))
    assert worst < 0.12


def test_clearly_shifted_samples_are_significant_and_equal_ones_are_not():
    low = [1.0 + 0.01 * i for i in range(20)]
    high = [2.0 + 0.01 * i for i in range(20)]
    assert mann_whitney(low, high).p_value < 1e-6
    assert mann_whitney(low, high).u == 400
    assert mann_whitney(high, low).u == 0
    assert mann_whitney([3.0] * 5, [3.0] * 5).p_value == 1.0


def test_large_samples_use_the_normal_approximation():
    side = int(math.isqrt(EXACT_MAX_PAIRS)) + 2
    test = mann_whitney([float(i) for i in range(side)], [i + 0.5 for i in range(side)])
    assert test.method == "normal" and 0.5 < test.p_value <= 1.0
    tied = mann_whitney([float(i // 2) for i in range(60)], [float(i // 2) + 1 for i in range(60)])
    assert tied.method == "normal" and 0 < tied.p_value < 1


def test_an_empty_side_is_refused():
    with pytest.raises(ValueError, match="at least one sample"):
        mann_whitney([], [1.0])
