"""Pool states for the defrag tests: LIFO churn like a busy server's, on host lists or a KVPool."""

from __future__ import annotations

import random

import torch

from serving.kv.pool import KVPool


def churn_lists(num_slots: int, steps: int, seed: int, release: float = 0.12, new: float = 0.25,
                max_grow: int = 6) -> tuple[dict[int, list[int]], list[int]]:
    """(request id -> slots in position order, free slots) after ``steps`` random grows, new
    requests and releases over a LIFO free stack (slot 0 never used)."""
    rng = random.Random(seed)
    free = list(range(num_slots - 1, 0, -1))
    reqs: dict[int, list[int]] = {}
    next_id = 1
    for _ in range(steps):
        if reqs and rng.random() < release:
            free.extend(reversed(reqs.pop(rng.choice(list(reqs)))))
            continue
        if not reqs or rng.random() < new:
            reqs[next_id] = []
            next_id += 1
        r = rng.choice(list(reqs))
        k = rng.randint(1, max_grow)
        if k <= len(free):
            reqs[r].extend(free.pop() for _ in range(k))
    return {r: s for r, s in reqs.items() if s}, free


def churn_pool(num_slots: int, steps: int, seed: int, layers: int = 2, row_dim: int = 8,
               dtype: torch.dtype = torch.float32, max_requests: int = 64) -> KVPool:
    """A ``KVPool`` with random rows after the same kind of churn through its own allocator."""
    rng = random.Random(seed)
    pool = KVPool(layers, num_slots, row_dim, dtype, "cpu", max_requests=max_requests, max_context=num_slots)
    pool.kv.copy_(torch.randn(pool.kv.shape, generator=torch.Generator().manual_seed(seed)).to(dtype))
    next_id = 1
    for _ in range(steps):
        live = pool.table.requests()
        if live and rng.random() < 0.12:
            pool.release_request(rng.choice(live))
            continue
        if (not live or rng.random() < 0.25) and len(live) < max_requests:
            pool.table.add(next_id)
            next_id += 1
            live = pool.table.requests()
        r = rng.choice(live)
        k = rng.randint(1, 6)
        if k <= pool.allocator.num_free:
            pool.table.append(r, pool.alloc(k))
    for i, r in enumerate(pool.table.requests()):  # empty requests go, and a third of the rest: room to move
        if not pool.table.length(r) or i % 3 == 2:
            pool.release_request(r)
    return pool


def snapshot(pool: KVPool) -> dict:
    """Everything a failed piece must leave as it was: each live request's slots and rows, the
    device table, the allocator's free slots in hand-out order."""
    t = pool.table
    return {
        "slots": {r: list(t.slots(r)) for r in t.requests()},
        "rows": {r: pool.kv[:, t.slots(r)].clone() for r in t.requests()},
        "table": t.rows.clone(),
        "free": pool.allocator.free_slots(),
        "num_free": pool.allocator.num_free,
    }


def same_state(pool: KVPool, snap: dict) -> bool:
    now = snapshot(pool)
    return (now["slots"] == snap["slots"] and now["free"] == snap["free"] and now["num_free"] == snap["num_free"]
            and torch.equal(now["table"], snap["table"])
            and all(torch.equal(now["rows"][r], snap["rows"][r]) for r in snap["rows"]))
