"""Fragmentation measures: runs, leading runs, free runs, and the incremental tracker."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.defrag.measure import (
    RunTracker,
    count_runs,
    free_runs,
    leading_run,
    measure,
    run_histogram,
)


def test_runs_and_leading_runs():
    assert count_runs([]) == 0 and leading_run([]) == 0
    assert count_runs([5]) == 1 and leading_run([5]) == 1
    assert count_runs([1, 2, 3, 7, 8, 4]) == 3 and leading_run([1, 2, 3, 7, 8, 4]) == 3
    assert count_runs([3, 2, 1]) == 3  # position order matters: descending slots are not a run
    assert leading_run(list(range(10, 200))) == 190


def test_free_runs_and_their_histogram():
    runs = free_runs([9, 1, 2, 3, 5, 10, 11, 12, 13, 20])
    assert sorted(runs.tolist()) == [1, 1, 3, 5]
    assert run_histogram(runs) == {"1": 2, "2-3": 1, "4-7": 1}
    assert free_runs([]).size == 0 and run_histogram(np.zeros(0, dtype=np.int64)) == {}


def test_pool_summary_is_token_weighted():
    f = measure({1: list(range(1, 1001)), 2: [2000, 1500, 1700, 1800]}, free=[3000, 3001, 3005])
    s = f.summary()
    assert s["requests"] == 2 and s["contiguous_requests"] == 1 and s["live_tokens"] == 1004
    assert s["runs_per_1k"] == round(1000 * 5 / 1004, 3) and s["max_runs_per_1k"] == 1000.0
    assert s["largest_free_run"] == 2 and s["free_slots"] == 3


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 40))
def test_the_tracker_matches_a_full_rescan_as_requests_grow_and_move(seed, rounds):
    rng = random.Random(seed)
    reqs: dict[int, list[int]] = {}
    tracker = RunTracker()
    for _ in range(rounds):
        r = rng.randint(1, 4)
        if rng.random() < 0.15 and r in reqs:
            del reqs[r]
        else:
            base = reqs.setdefault(r, [])
            start = rng.choice([base[-1] + 1 if base else 1, rng.randint(1, 500)])
            base.extend(range(start, start + rng.choice([1, 2, 100])))  # 100: the numpy paths
        if rng.random() < 0.2 and reqs:  # slots renamed: the caller says so
            moved = rng.choice(list(reqs))
            reqs[moved] = [s + 1000 for s in reqs[moved]]
            tracker.forget(moved)
        tracker.update(reqs)
        for f in tracker.all():
            slots = reqs[f.req_id]
            assert (f.length, f.runs, f.leading) == (len(slots), count_runs(slots), leading_run(slots))
        assert {f.req_id for f in tracker.all()} == set(reqs)
