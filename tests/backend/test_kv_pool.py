"""The page_size=1 pool: allocation, reuse, exhaustion, bad frees, the slot table."""

from __future__ import annotations

import pytest
import torch

from serving.engine.kv_pool import KVPool, PoolExhausted, SlotAllocator


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
