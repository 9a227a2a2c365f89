"""The compaction planner: ordered moves that lose no row, write only free or vacated slots
(applied at once, move by move or in chunks), leave every placed request contiguous and the
free count unchanged, and move no more than simple bounds allow."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.defrag.measure import count_runs, leading_run
from serving.defrag.planner import plan_compaction, simulate, split_waves
from tests.defrag.pools import churn_lists


@st.composite
def pool_states(draw):
    num_slots = draw(st.integers(8, 160))
    steps = draw(st.integers(0, 90))
    seed = draw(st.integers(0, 10_000))
    reqs, free = churn_lists(num_slots, steps, seed, release=draw(st.sampled_from([0.05, 0.15, 0.3])))
    drop = draw(st.integers(0, len(reqs)))  # finished requests open room
    for r in list(reqs)[:drop]:
        free.extend(reqs.pop(r))
    select = None
    if reqs and draw(st.booleans()):
        select = draw(st.lists(st.sampled_from(sorted(reqs)), unique=True))
    return num_slots, reqs, free, select, draw(st.integers(0, 4)), draw(st.sampled_from([None, 1, 2, 5]))


def check_plan(num_slots, reqs, free, select, reserve, chunk):
    plan = plan_compaction(reqs, free, num_slots, select=select, reserve=reserve)
    out, out_free = simulate(plan, reqs, free, chunk)  # asserts every piece reads and writes validly
    # No live row lost or duplicated: same requests and lengths, every slot held once.
    assert {r: len(s) for r, s in out.items()} == {r: len(s) for r, s in reqs.items()}
    held = [s for ss in out.values() for s in ss]
    assert len(held) == len(set(held)) and not set(held) & out_free
    assert len(out_free) == len(free) and 0 not in out_free
    chosen = set(reqs) if select is None else set(select)
    for r, slots in out.items():
        if r in plan.targets and r not in plan.incomplete:
            start = plan.targets[r]
            assert slots == list(range(start, start + len(slots)))
        if r not in chosen or count_runs(reqs[r]) <= 1:  # pinned: the leading run never moves
            lead = leading_run(reqs[r])
            assert slots[:lead] == reqs[r][:lead]
            assert r not in plan.targets
    # Accounting and bounds.
    placed_len = sum(len(reqs[r]) for r in plan.targets)
    if not plan.incomplete:  # else the cycles' moves are left out
        assert plan.num_moves == placed_len - plan.kept + plan.evictions + plan.temp_moves
    assert 2 * plan.temp_moves <= plan.num_moves - plan.temp_moves
    movable = sum(len(s) for r, s in reqs.items() if r in chosen and count_runs(s) > 1)
    loose = sum(len(s) - leading_run(s) for r, s in reqs.items() if not (r in chosen and count_runs(s) > 1))
    assert plan.num_moves - plan.temp_moves <= movable + loose
    assert plan.kept <= placed_len and plan.lower_bound <= movable
    if not plan.incomplete and free:
        assert set(plan.targets) | set(plan.deferred) == {r for r in chosen if r in reqs and count_runs(reqs[r]) > 1}
    return plan


@settings(max_examples=300, deadline=None)
@given(pool_states())
def test_plans_are_valid_move_by_move_in_chunks_and_at_once(state):
    check_plan(*state)


def test_a_long_churned_pool_compacts_every_request_with_a_free_tail():
    reqs, free = churn_lists(3000, 1500, seed=3, release=0.08)
    num_slots = 3000 + sum(len(s) for s in reqs.values()) + 64  # room for everyone after the old pool
    free = free + list(range(3000, num_slots))
    plan = check_plan(num_slots, reqs, free, None, 8, 97)
    assert not plan.deferred and not plan.incomplete
    assert len(plan.targets) == sum(count_runs(s) > 1 for s in reqs.values())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(2, 30), st.integers(0, 6)), min_size=1, max_size=6), st.integers(0, 10_000))
def test_without_conflicts_each_request_keeps_its_best_offset_and_moves_only_the_rest(layout, seed):
    """Requests in disjoint regions, a few rows of each displaced into a free area: the plan
    moves exactly the displaced rows (the lower bound) and nothing else."""
    rng = np.random.default_rng(seed)
    reqs, cursor, far = {}, 1, []
    for r, (length, stray) in enumerate(layout, start=1):
        stray = min(stray, (length - 1) // 2)  # the original offset stays the best
        slots = list(range(cursor, cursor + length))
        for p in rng.choice(length, size=stray, replace=False):
            slots[p] = -1 - len(far)  # placeholder: a slot in the far free area
            far.append((r, int(p)))
        reqs[r] = slots
        cursor += length + 3
    num_slots = cursor + len(far) + 5
    far_slots = rng.permutation(np.arange(cursor, cursor + len(far)))
    for k, (r, p) in enumerate(far):
        reqs[r][p] = int(far_slots[k])
    owned = {s for ss in reqs.values() for s in ss}
    free = [s for s in range(1, num_slots) if s not in owned]
    plan = plan_compaction(reqs, free, num_slots)
    simulate(plan, reqs, free)
    assert plan.num_moves == plan.lower_bound == len(far)
    assert plan.evictions == plan.temp_moves == 0


def test_a_swap_is_broken_through_a_free_slot_and_without_one_stays_incomplete():
    # Request 1 holds 3, 2 (wants 2, 3); request 2 holds 5, 4: two cycles of two.
    reqs = {1: [3, 2, 1], 2: [5, 4]}
    plan = plan_compaction(reqs, [6], 7, select=[1, 2])
    assert plan.temp_moves >= 1 and not plan.incomplete
    out, free = simulate(plan, reqs, [6], chunk=1)
    assert len(free) == 1
    for r, start in plan.targets.items():
        assert out[r] == list(range(start, start + len(out[r])))
    full = plan_compaction({1: [2, 1], 2: [4, 3]}, [], 5)
    assert full.num_moves == 0 and full.incomplete == [1, 2]


def test_split_waves_cuts_where_a_written_slot_is_read_again():
    src, dst = np.array([1, 5, 9, 3]), np.array([9, 1, 2, 5])  # 9 written, then read
    assert split_waves(src, dst) == [(0, 2), (2, 4)]
    # A bare swap is not a valid sequence (the planner breaks it through a free slot); split anyway.
    assert split_waves(np.array([2, 1]), np.array([1, 2])) == [(0, 1), (1, 2)]
    assert split_waves(np.zeros(0, int), np.zeros(0, int)) == []


@pytest.mark.parametrize(
    "reqs, free, message",
    [
        ({1: [1, 2]}, [2], "twice"),
        ({1: [1, 2], 2: [2]}, [], "twice"),
        ({1: [0, 1]}, [], r"slots in \[1, 9\]"),
        ({1: [10]}, [], r"slots in \[1, 9\]"),
    ],
)
def test_inconsistent_pools_are_refused(reqs, free, message):
    with pytest.raises(ValueError, match=message):
        plan_compaction(reqs, free, 10)


def test_contiguous_and_unselected_requests_stay_and_empty_pools_plan_nothing():
    assert plan_compaction({}, [1, 2, 3], 4).num_moves == 0
    reqs = {1: [1, 2, 3], 2: [6, 4, 5]}
    plan = plan_compaction(reqs, [7, 8, 9], 10, select=[1])
    assert plan.num_moves == 0 and plan.targets == {}
    plan = plan_compaction(reqs, [7, 8, 9], 10)
    assert 1 not in plan.targets and set(plan.targets) == {2}


def test_runs_of_claimable_slots_split_on_claims_and_can_run_out():
    from serving.defrag.planner import _Holes

    holes = _Holes(np.array([True, False, False, False, True, False, False]))
    assert holes.fits(np.array([1, 2, 3, 5, 0, -1]), 2).tolist() == [True, True, False, True, False, False]
    holes.claim(1, 3)
    holes.claim(5, 2)
    assert holes.fits(np.array([1, 5]), 1).tolist() == [False, False] and len(holes.starts) == 0
