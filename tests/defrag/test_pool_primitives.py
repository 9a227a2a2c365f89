"""The pool primitives compaction builds on: reserving given slots, renaming slots at known
(request, position) pairs, and the lazily pruned free stack behind cheap relocations."""

from __future__ import annotations

import random

import pytest
import torch

from serving.kv.pool import KVPool, PoolExhausted, SlotAllocator


def test_reserve_takes_exactly_the_given_free_slots_or_none():
    alloc = SlotAllocator(10)
    alloc.reserve([3, 7])
    assert alloc.num_free == 7 and not alloc.is_free(3) and not alloc.is_free(7)
    assert 3 not in alloc.alloc(7) and alloc.num_free == 0
    with pytest.raises(PoolExhausted):
        alloc.alloc(1)
    alloc.free([3])
    for bad in ([3, 3], [3, 0], [3, 10], [3, 5]):  # twice, foreign, out of range, allocated
        with pytest.raises(ValueError, match="free slots of this pool"):
            alloc.reserve(bad)
        assert alloc.is_free(3)
    assert alloc.alloc(1) == [3]


def test_long_reserve_and_relocate_refuse_one_bad_slot_and_change_nothing():
    alloc = SlotAllocator(1000)
    held = alloc.alloc(200)
    free = alloc.free_slots()
    for bad in ([*free[:99], free[0]], [*free[:99], held[0]], [*free[:99], 0], [*free[:99], 1000]):
        with pytest.raises(ValueError, match="free slots of this pool"):
            alloc.reserve(bad)
        assert alloc.free_slots() == free
    for bad in ([*free[:99], free[0]], [*free[:99], held[150]], [*free[:99], 1000]):
        with pytest.raises(ValueError, match="Expected"):
            alloc.relocate(held[:100], bad)
        assert alloc.free_slots() == free
    alloc.relocate(held[:100], [*held[50:100], *free[:50]])  # a chain: half the destinations vacated by the call
    assert alloc.num_free == len(free) and all(alloc.is_free(s) for s in held[:50])


@pytest.mark.parametrize("scale", [1, 40])  # 40: long lists, through the vectorized checks
def test_lazy_free_stack_hands_out_what_an_eager_one_would(scale):
    """Random alloc / free / relocate / reserve against a model of the old eager stack."""
    rng = random.Random(0)
    alloc = SlotAllocator(300 * scale)
    model = list(range(300 * scale - 1, 0, -1))
    held: list[int] = []
    for _ in range(3000 if scale == 1 else 300):
        op = rng.random()
        if op < 0.35 and model:
            n = rng.randint(1, min(5 * scale, len(model)))
            got = alloc.alloc(n)
            assert got == [model.pop() for _ in range(n)]
            held += got
        elif op < 0.6 and held:
            out = rng.sample(held, rng.randint(1, min(4 * scale, len(held))))
            alloc.free(out)
            model.extend(out)
            gone = set(out)
            held = [s for s in held if s not in gone]
        elif op < 0.85 and held and model:
            k = rng.randint(1, min(3 * scale, len(held), len(model)))
            src = rng.sample(held, k)
            dst = rng.sample(model, k)
            alloc.relocate(src, dst)
            taken, moved = set(dst), set(src)
            model = [s for s in model if s not in taken] + sorted(src, reverse=True)
            held = [s for s in held if s not in moved] + dst
        elif model:
            got = rng.sample(model, rng.randint(1, min(3 * scale, len(model))))
            alloc.reserve(got)
            taken = set(got)
            model = [s for s in model if s not in taken]
            held += got
        assert alloc.free_slots() == model and alloc.num_free == len(model)


def test_rename_at_renames_host_and_device_or_nothing():
    pool = KVPool(1, 16, 4, torch.float32, "cpu", max_requests=2, max_context=8)
    for r, slots in ((1, [1, 2, 3]), (2, [4, 5])):
        pool.table.add(r)
        pool.table.append(r, pool.alloc(len(slots)))
    pool.table.rename_at([1, 2], [2, 0], [3, 4], [9, 10])
    assert pool.table.slots(1) == [1, 2, 9] and pool.table.slots(2) == [10, 5]
    assert pool.table.device_slots(1).tolist() == [1, 2, 9] and pool.table.device_slots(2).tolist() == [10, 5]
    rows = pool.table.rows.clone()
    for args in (([1], [2], [3], [11]), ([1, 1], [0, 0], [1, 1], [11, 12]), ([3], [0], [1], [11]), ([1], [5], [1], [11])):
        with pytest.raises(ValueError, match="Expected request"):
            pool.table.rename_at(*args)
        assert torch.equal(pool.table.rows, rows) and pool.table.slots(1) == [1, 2, 9]
