"""Change points of a metric's history: seeded series with planted steps, which must be found at
the run where they start, and noise and single outliers, which must not be."""

from __future__ import annotations

import math
import random

import pytest

from runner.plan.changepoints import MAX_RUNS, find_changes


def run(rng: random.Random, level: float, samples: int = 10, spread: float = 0.03) -> list[float]:
    """One run: ``samples`` timings around ``level`` with a relative spread."""
    return [level * (1 + rng.gauss(0, spread)) for _ in range(samples)]


def found(series, floor: float = 0.10) -> list[tuple[int, float]]:
    return [(change.index, round(change.relative, 2)) for change in find_changes(series, floor=floor)]


@pytest.mark.parametrize("seed", range(8))
def test_planted_steps_are_found_at_the_run_where_they_start(seed):
    rng = random.Random(seed)
    series = ([run(rng, 10.0) for _ in range(15)] + [run(rng, 13.0) for _ in range(10)]
              + [run(rng, 10.0) for _ in range(12)])
    changes = find_changes(series, floor=0.10)
    assert [change.index for change in changes] == [15, 25]
    up, down = changes
    assert up.before == pytest.approx(10.0, rel=0.02) and up.after == pytest.approx(13.0, rel=0.02)
    assert up.relative == pytest.approx(0.3, abs=0.03) and down.relative == pytest.approx(-3 / 13, abs=0.03)
    assert (up.runs_before, up.runs_after, down.runs_after) == (15, 10, 12)
    assert up.p_value < 1e-6


@pytest.mark.parametrize("seed", range(10))
def test_noise_reports_nothing(seed):
    rng = random.Random(1000 + seed)
    wide = [run(rng, 10.0, spread=0.3) for _ in range(60)]  # wide samples
    jittery = [run(rng, 10.0 * (1 + rng.gauss(0, 0.04)), samples=20, spread=0.005) for _ in range(60)]  # runs differ
    single = [[10.0 * (1 + rng.gauss(0, 0.03))] for _ in range(60)]  # one number per run
    assert found(wide) == [] and found(jittery) == [] and found(single) == []


@pytest.mark.parametrize("where", [0, 9, 19])
def test_a_single_outlier_run_is_not_a_step(where):
    rng = random.Random(where)
    series = [run(rng, 10.0) for _ in range(20)]
    series[where] = run(rng, 30.0)
    assert found(series) == []


def test_a_move_within_the_floor_is_no_change_however_significant():
    rng = random.Random(7)
    series = [run(rng, 10.0, spread=0.005) for _ in range(20)] + [run(rng, 10.6, spread=0.005) for _ in range(20)]
    assert found(series, floor=0.10) == []
    assert found(series, floor=0.05) == [(20, 0.06)]  # the gate's own tolerance decides


def test_a_level_needs_two_runs():
    rng = random.Random(3)
    series = [run(rng, 10.0) for _ in range(20)]
    assert found([*series, run(rng, 20.0)]) == []  # the newest run alone: not yet a level
    assert found([*series, run(rng, 20.0), run(rng, 20.0)]) == [(20, 1.0)]


def test_a_short_bump_between_two_levels_is_found():
    rng = random.Random(11)
    series = [run(rng, 10.0) for _ in range(10)] + [run(rng, 13.0) for _ in range(3)] + [run(rng, 10.0) for _ in range(10)]
    assert [index for index, _ in found(series)] == [10, 13]


def test_single_numbers_confirm_a_step_only_with_enough_runs():
    rng = random.Random(5)
    many = [[10 + rng.gauss(0, 0.2)] for _ in range(12)] + [[14 + rng.gauss(0, 0.2)] for _ in range(12)]
    assert [index for index, _ in found(many)] == [12]
    few = [[10.0], [10.1], [9.9], [14.0], [14.1], [13.9]]  # 3 and 3: no rank test can be sure
    assert found(few) == []


def test_wide_samples_make_a_move_harder_to_confirm():
    rng = random.Random(9)
    tight = [run(rng, 10.0, samples=5, spread=0.01) for _ in range(3)] + [run(rng, 12.0, samples=5, spread=0.01) for _ in range(3)]
    wide = [run(rng, 10.0, samples=5, spread=0.5) for _ in range(3)] + [run(rng, 12.0, samples=5, spread=0.5) for _ in range(3)]
    assert found(tight) == [(3, 0.2)] and found(wide) == []


def test_from_zero_and_short_series():
    assert found([[0.0]] * 10 + [[1.0]] * 10)[0][0] == 10
    assert math.isinf(find_changes([[0.0]] * 10 + [[1.0]] * 10, floor=0.1)[0].relative)
    assert found([[1.0], [2.0], [3.0]]) == []
    assert found([]) == []


def test_bad_samples_are_refused():
    with pytest.raises(ValueError):
        find_changes([[1.0], [], [1.0], [1.0]], floor=0.1)
    with pytest.raises(ValueError):
        find_changes([[1.0], [math.nan], [1.0], [1.0]], floor=0.1)


def test_a_long_history_keeps_its_newest_runs_and_stays_quick():
    rng = random.Random(2)
    series = [run(rng, 10.0, samples=5) for _ in range(MAX_RUNS + 100)] + [run(rng, 15.0, samples=5) for _ in range(50)]
    assert [index for index, _ in found(series)] == [MAX_RUNS + 100]  # indices stay those of the whole series
