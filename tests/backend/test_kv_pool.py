"""The page_size=1 pool: allocation, reuse, exhaustion, bad frees, the slot table."""

from __future__ import annotations

import pytest
import torch

from serving.kv.pool import KVPool, PoolExhausted, SlotAllocator, TableFull


def test_slot_zero_is_never_handed_out_and_all_others_are():
    alloc = SlotAllocator(9)
    slots = alloc.alloc(8)
    assert sorted(slots) == list(range(1, 9))
    assert alloc.num_free == 0


def test_freed_slots_are_reused_first():
    alloc = SlotAllocator(64)
    a = alloc.alloc(10)
    b = alloc.alloc(10)
    alloc.free(a[2:5])
    c = alloc.alloc(3)
    assert set(c) == set(a[2:5])
    assert not set(c) & set(b)


def test_exhaustion_is_all_or_nothing_with_a_clear_message():
    alloc = SlotAllocator(6)
    alloc.alloc(3)
    with pytest.raises(PoolExhausted, match=r"pool exhausted: asked 3, free 2"):
        alloc.alloc(3)
    assert alloc.num_free == 2
    assert len(alloc.alloc(2)) == 2


def test_double_free_is_rejected_and_frees_nothing():
    alloc = SlotAllocator(8)
    s = alloc.alloc(3)
    alloc.free([s[0]])
    with pytest.raises(ValueError, match=f"double free of slot {s[0]}"):
        alloc.free([s[1], s[0]])
    assert alloc.num_free == 5  # s[1] was not freed either
    with pytest.raises(ValueError, match="double free"):
        alloc.free([s[2], s[2]])


@pytest.mark.parametrize("slot", [0, 8, -1, 100])
def test_foreign_slots_are_rejected(slot):
    alloc = SlotAllocator(8)
    alloc.alloc(7)
    with pytest.raises(ValueError, match="foreign slot"):
        alloc.free([slot])
    assert alloc.num_free == 0


def test_long_churn_scatters_requests_and_keeps_counts():
    gen = torch.Generator().manual_seed(0)
    pool = KVPool(1, 200, 8, torch.float32, "cpu")
    live: dict[int, int] = {}
    for step in range(300):
        req = int(torch.randint(0, 12, (1,), generator=gen))
        if req in live and torch.rand(1, generator=gen) < 0.3:
            pool.release_request(req)
            del live[req]
        else:
            n = int(torch.randint(1, 6, (1,), generator=gen))
            if n <= pool.allocator.num_free:
                pool.table.append(req, pool.alloc(n))
                live[req] = live.get(req, 0) + n
        assert pool.leaked_slots() == 0
        assert pool.allocator.num_free + sum(live.values()) == 199
    scattered = [r for r in live if pool.table.slots(r) != list(range(pool.table.slots(r)[0], pool.table.slots(r)[0] + live[r]))]
    assert scattered, "a long run should leave some request with non-contiguous slots"


def test_pool_shape():
    pool = KVPool(3, 10, 576, torch.bfloat16, "cpu")
    assert pool.kv.shape == (3, 10, 576) and pool.layer(2).shape == (10, 576)
    with pytest.raises(ValueError, match="num_slots >= 2"):
        SlotAllocator(1)


def live_pool():
    pool = KVPool(2, 16, 4, torch.float32, "cpu", max_requests=2, max_context=8)
    pool.kv.copy_(torch.randn(pool.kv.shape, generator=torch.Generator().manual_seed(0)))
    for req, n in ((1, 3), (2, 2)):
        pool.table.add(req)
        pool.table.append(req, pool.alloc(n))
    return pool  # request 1: slots 1, 2, 3; request 2: slots 4, 5


def test_slot_table_rows_mirror_the_host_lists_and_row_zero_stays_padding():
    pool = live_pool()
    for req in (1, 2):
        assert pool.table.device_slots(req).tolist() == pool.table.slots(req)
    assert pool.table.rows[0].eq(0).all()
    assert {pool.table.row(1), pool.table.row(2)} == {1, 2}
    with pytest.raises(TableFull, match="slot table full"):
        pool.table.add(3)
    with pytest.raises(TableFull, match="max_context 8"):
        pool.table.append(1, [9] * 6)
    pool.release_request(2)
    pool.table.add(3)  # the freed row is reused
    assert pool.table.length(3) == 0


def test_move_rows_moves_every_layer_and_renames_the_slots():
    """A chain (3 -> 6, 2 -> 3) with an overlap: every row arrives intact on every layer."""
    pool = live_pool()
    before = {s: pool.kv[:, s].clone() for s in (1, 2, 3, 4, 5)}
    pool.move_rows([3, 2], [6, 3])
    assert pool.table.slots(1) == [1, 3, 6] and pool.table.device_slots(1).tolist() == [1, 3, 6]
    assert torch.equal(pool.kv[:, 6], before[3]) and torch.equal(pool.kv[:, 3], before[2])
    assert torch.equal(pool.kv[:, 1], before[1]) and torch.equal(pool.kv[:, 4], before[4])
    assert pool.allocator.is_free(2) and not pool.allocator.is_free(6) and not pool.allocator.is_free(3)
    assert pool.leaked_slots() == 0 and pool.allocator.num_free == 15 - 5


@pytest.mark.parametrize(
    "src, dst, message",
    [
        ([1], [4], "free or vacated"),          # destination owned by another request
        ([7], [8], "double free|allocated"),     # source not allocated
        ([1, 2], [6, 6], "free or vacated"),     # one destination twice
        ([1], [0], r"destination slots in \[1, 15\]"),
        ([1, 2], [6], "as many destinations"),
    ],
)
def test_bad_moves_change_nothing(src, dst, message):
    pool = live_pool()
    kv = pool.kv.clone()
    state = (pool.table.slots(1)[:], pool.table.slots(2)[:], pool.allocator.free_slots(), pool.table.rows.clone())
    with pytest.raises(ValueError, match=message):
        pool.move_rows(src, dst)
    assert torch.equal(pool.kv, kv)
    assert state[:3] == (pool.table.slots(1), pool.table.slots(2), pool.allocator.free_slots())
    assert torch.equal(state[3], pool.table.rows)


def test_moving_an_allocated_but_unowned_slot_is_refused():
    pool = live_pool()
    scratch = pool.alloc(1)[0]
    with pytest.raises(ValueError, match="owned by live requests"):
        pool.move_rows([scratch], [15])
    assert not pool.allocator.is_free(scratch) and pool.allocator.is_free(15)
