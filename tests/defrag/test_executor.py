"""The executor: plans applied to a KVPool on every layer, in budget-sized steps, with the
engine allocating and finishing requests in between, and exact undo on injected failures."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from serving.defrag.executor import (
    Compaction,
    _copy_rows,
    copy_rows_direct,
    gather_rows,
    scatter_rows,
)
from serving.defrag.planner import MovePlan, plan_compaction, split_waves
from serving.kv.pool import KVPool
from tests.defrag.pools import churn_pool, same_state, snapshot


def plan_for(pool: KVPool, **kwargs):
    t = pool.table
    return plan_compaction({r: t.slots(r) for r in t.requests()}, pool.allocator.free_slots(), pool.num_slots, **kwargs)


def rows_of(pool: KVPool) -> dict[int, torch.Tensor]:
    return {r: pool.kv[:, pool.table.slots(r)].clone() for r in pool.table.requests()}


def assert_consistent(pool: KVPool, rows: dict[int, torch.Tensor], reserved: int = 0) -> None:
    t = pool.table
    for r in t.requests():
        if r in rows:
            assert torch.equal(pool.kv[:, t.slots(r)], rows[r][:, : t.length(r)])
        assert t.device_slots(r).tolist() == t.slots(r)
    owned = [s for r in t.requests() for s in t.slots(r)]
    assert len(owned) == len(set(owned)) and not any(pool.allocator.is_free(s) for s in owned)
    assert pool.leaked_slots() == reserved
    assert len(pool.allocator.free_slots()) == pool.allocator.num_free


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("max_moves", [1, 5, None])
def test_compaction_keeps_every_row_and_makes_placed_requests_contiguous(seed, max_moves):
    pool = churn_pool(160, 160, seed, layers=3)
    rows, free = rows_of(pool), pool.allocator.num_free
    plan = plan_for(pool, reserve=seed % 3)
    c = Compaction(pool, plan, copy="torch")
    while not c.done:
        c.step(max_moves)
        assert_consistent(pool, rows, reserved=len(c.reserved))
    assert pool.allocator.num_free == free and c.stats.dropped == 0 and not plan.incomplete
    for r, start in plan.targets.items():
        assert pool.table.slots(r) == list(range(start, start + pool.table.length(r)))


@pytest.mark.parametrize("seed", range(8))
def test_the_engine_may_allocate_grow_and_finish_requests_between_steps(seed):
    rng = random.Random(seed)
    pool = churn_pool(200, 150, seed)
    rows = rows_of(pool)
    c = Compaction(pool, plan_for(pool, reserve=2), copy="torch")
    next_id = 10_000
    while not c.done:
        c.step(rng.choice([1, 3, 8]))
        live = pool.table.requests()
        action = rng.random()
        if action < 0.3 and live:  # a request finishes
            victim = rng.choice(live)
            pool.release_request(victim)
            rows.pop(victim, None)
        elif action < 0.7 and live and pool.allocator.num_free >= 3:  # a request grows (scattered slots)
            r = rng.choice(live)
            new = pool.alloc(3)
            pool.kv[:, new] = torch.randn(pool.kv.shape[0], 3, pool.kv.shape[2])
            pool.table.append(r, new)
            rows[r] = pool.kv[:, pool.table.slots(r)].clone()
        elif pool.allocator.num_free >= 2:  # a new request
            pool.table.add(next_id)
            pool.table.append(next_id, pool.alloc(2))
            rows[next_id] = pool.kv[:, pool.table.slots(next_id)].clone()
            next_id += 1
        assert_consistent(pool, rows, reserved=len(c.reserved))
    assert pool.leaked_slots() == 0


@pytest.mark.parametrize("where", ["copy", "table", "allocator"])
@pytest.mark.parametrize("seed", range(4))
def test_a_failure_inside_a_piece_leaves_the_pool_as_before_it(where, seed):
    pool = churn_pool(120, 140, seed)
    plan = plan_for(pool)
    assert plan.num_moves > 4
    calls = {"n": 0}
    fail_on = random.Random(seed).randint(1, 4)

    def faults(stage: str) -> None:
        if stage == where:
            calls["n"] += 1
            if calls["n"] == fail_on:
                raise RuntimeError(f"injected at {stage}")

    c = Compaction(pool, plan, copy="torch", faults=faults)
    rows = rows_of(pool)
    failed = False
    while not c.done:
        before, at = snapshot(pool), c.next
        try:
            c.step(1)  # one move: one piece
        except RuntimeError as exc:
            assert "injected" in str(exc)
            assert same_state(pool, before) and c.next == at  # the failing piece left no trace
            failed = True
    assert failed
    assert_consistent(pool, rows)  # retried after the failure: compacted, nothing lost
    for r, start in plan.targets.items():
        assert pool.table.slots(r) == list(range(start, start + pool.table.length(r)))


@pytest.mark.parametrize("where", ["copy", "table", "allocator"])
def test_a_piece_whose_destination_is_its_own_source_is_undone_from_the_gathered_rows(where):
    """Moves 3 -> 6 then 5 -> 3 in one piece: slot 3 is read and overwritten; a failure after
    the scatter must put its row back."""
    pool = KVPool(2, 8, 4, torch.float32, "cpu", max_requests=2, max_context=8)
    pool.kv.copy_(torch.randn(pool.kv.shape, generator=torch.Generator().manual_seed(0)))
    pool.table.add(1)
    pool.allocator.reserve([5, 3])
    pool.table.append(1, [5, 3])
    plan = MovePlan(req=np.array([1, 1]), pos=np.array([1, 0]), src=np.array([3, 5]), dst=np.array([6, 3]))

    def faults(stage: str) -> None:
        if stage == where:
            raise RuntimeError("injected")

    rows = rows_of(pool)
    c = Compaction(pool, plan, copy="torch", faults=faults)
    before = snapshot(pool)
    with pytest.raises(RuntimeError, match="injected"):
        c.step()
    assert same_state(pool, before) and c.reserved == {6}
    c.cancel()
    Compaction(pool, plan, copy="torch").run()
    assert pool.table.slots(1) == [3, 6] and torch.equal(pool.kv[:, [3, 6]], rows[1])


@pytest.mark.parametrize("seed", [0, 4, 5])  # pools whose plans break cycles
def test_a_failure_in_a_later_piece_keeps_the_earlier_ones_and_a_consistent_pool(seed):
    """Pieces are the unit of atomicity: a step of many pieces that fails keeps what its earlier
    pieces moved; the pool is consistent, and the compaction can go on."""
    pool = churn_pool(160, 200, seed)
    plan = plan_for(pool)
    assert plan.temp_moves > 0  # cycles: a hop-out piece, then the rest
    calls = {"n": 0}

    def faults(stage: str) -> None:
        calls["n"] += stage == "table"
        if calls["n"] == 2 and stage == "table":
            raise RuntimeError("injected")

    c = Compaction(pool, plan, copy="torch", faults=faults)
    rows = rows_of(pool)
    with pytest.raises(RuntimeError, match="injected"):
        c.step()
    assert 0 < c.next < plan.num_moves and c.stats.pieces == 1
    assert_consistent(pool, rows, reserved=len(c.reserved))
    c.run()
    assert_consistent(pool, rows)


def test_cancel_returns_the_reservations_and_keeps_what_moved():
    pool = churn_pool(150, 150, 5)
    rows, free = rows_of(pool), pool.allocator.num_free
    c = Compaction(pool, plan_for(pool), copy="torch")
    assert pool.allocator.num_free == free - len(c.reserved) and c.reserved
    c.step(3)
    c.cancel()
    assert c.done and not c.reserved and pool.allocator.num_free == free
    assert_consistent(pool, rows)


@pytest.mark.parametrize("dtype, dim", [(torch.bfloat16, 576), (torch.float32, 48), (torch.float16, 7), (torch.uint8, 5)])
def test_triton_row_copy_moves_bytes_exactly(dtype, dim):
    gen = torch.Generator().manual_seed(dim)
    kv = torch.randint(0, 255, (3, 40, dim), dtype=torch.uint8, generator=gen) if dtype == torch.uint8 else \
        torch.randn(3, 40, dim, generator=gen).to(dtype)
    expect = kv.clone()
    src = torch.tensor([1, 5, 7, 9, 30, 31, 2, 12], dtype=torch.int64)
    dst = torch.tensor([33, 34, 3, 35, 36, 37, 38, 39], dtype=torch.int64)
    copy_rows_direct(kv, src, dst)
    expect[:, dst] = expect[:, src]
    assert torch.equal(kv.view(torch.uint8), expect.view(torch.uint8))


def test_the_row_copy_reads_its_count_from_the_device():
    """The captured copy's form (``RowMover``): the grid covers 8 rows, the count in memory says 3;
    rows past it stay as they were."""
    kv = torch.randn(2, 20, 576, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    expect = kv.clone()
    src = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8], dtype=torch.int64)
    dst = torch.tensor([11, 12, 13, 14, 15, 16, 17, 18], dtype=torch.int64)
    _copy_rows(kv, kv, src, dst, 8, torch.tensor([3], dtype=torch.int64))
    expect[:, dst[:3]] = expect[:, src[:3]]
    assert torch.equal(kv.view(torch.int16), expect.view(torch.int16))


def test_a_compaction_through_the_triton_copy():
    pool = churn_pool(90, 90, 11, layers=2, row_dim=64, dtype=torch.bfloat16)
    rows = rows_of(pool)
    Compaction(pool, plan_for(pool), copy="triton").run(16)
    assert_consistent(pool, rows)


def overlapping_pieces(plan: MovePlan, max_moves: int) -> int:
    """Pieces of ``plan`` (``max_moves`` at a time) with a destination among their sources."""
    count = 0
    for b in range(0, plan.num_moves, max_moves):
        src, dst = plan.src[b : b + max_moves], plan.dst[b : b + max_moves]
        count += sum(not set(src[w0:w1].tolist()).isdisjoint(dst[w0:w1].tolist()) for w0, w1 in split_waves(src, dst))
    return count


def test_triton_gather_and_scatter_move_bytes_exactly():
    gen = torch.Generator().manual_seed(3)
    kv = torch.randn(3, 40, 576, generator=gen).to(torch.bfloat16)
    src = torch.tensor([4, 9, 1, 33, 17], dtype=torch.int64)
    dst = torch.tensor([9, 4, 20, 21, 1], dtype=torch.int64)  # destinations among the sources
    rows = gather_rows(kv, src)
    assert torch.equal(rows.view(torch.int16), kv[:, src].view(torch.int16))
    expect = kv.clone()
    expect[:, dst] = rows
    scatter_rows(kv, dst, rows)
    assert torch.equal(kv.view(torch.int16), expect.view(torch.int16))


@pytest.mark.parametrize("fail_at", [None, "copy", "table", "allocator"])
def test_a_compaction_through_the_triton_copy_with_overlapping_pieces(fail_at):
    pool = churn_pool(90, 90, 0, layers=2, row_dim=64, dtype=torch.bfloat16)
    plan = plan_for(pool)
    kinds = [not set(plan.src[b:b + 16][w0:w1].tolist()).isdisjoint(plan.dst[b:b + 16][w0:w1].tolist())
             for b in range(0, plan.num_moves, 16) for w0, w1 in split_waves(plan.src[b:b + 16], plan.dst[b:b + 16])]
    assert sum(kinds) >= 3  # the gather-then-scatter path is what runs here
    rows = rows_of(pool)
    pieces = []

    def fault(where):  # fails inside the first overlapping piece
        if where == "copy":
            pieces.append(where)
        if where == fail_at and kinds[len(pieces) - 1]:
            raise RuntimeError("injected")

    c = Compaction(pool, plan, copy="triton", faults=fault)
    if fail_at is None:
        c.run(16)
    else:
        with pytest.raises(RuntimeError, match="injected"):
            c.run(16)
        c.cancel()
    assert_consistent(pool, rows)  # an undone piece restored the sources its destinations overwrote
