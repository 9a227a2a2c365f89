"""What the defrag gates share: a pool whose every row carries a stamp, churned like a busy
server's, checked byte for byte; a verify-attention batch over its live requests.

A row's content is a function of its stamp (a unique number given when the row was written)
and its layer, regenerated on the device to check it, so no shadow copy of the pool is kept.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
from dataclasses import dataclass, field

import numpy as np
import torch

from kernel.reference import tree_mask_from_parents
from serving.kv.pool import KVPool

CHECK_ROWS = 1 << 15  # rows regenerated per comparison (bounds the temporary)


def gate_main(run, cpu_profile: dict, doc: str, argv: list[str] | None = None) -> int:
    """A gate's standalone command: ``--cpu`` (its CPU profile; the kernel then needs
    ``TRITON_INTERPRET=1`` in the environment) and ``--args`` (JSON keyword arguments for ``run``)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="the small CPU profile")
    parser.add_argument("--args", default="{}", help="JSON keyword arguments for run()")
    ns = parser.parse_args(argv)
    if ns.cpu and not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        print("error: the CPU profile runs the kernel in Triton's interpreter: set TRITON_INTERPRET=1", file=sys.stderr)
        return 2
    kwargs = dict(cpu_profile) if ns.cpu else {}
    kwargs.update(json.loads(ns.args))
    print(json.dumps(run(**kwargs), indent=1))
    return 0


def stamped_rows(stamps: torch.Tensor, num_layers: int, row_dim: int, dtype: torch.dtype) -> torch.Tensor:
    """[layers, N, row_dim] rows for int64 ``stamps`` [N] (on their device): finite values in
    [-2, 2), different per stamp, layer and column."""
    col = torch.arange(row_dim, device=stamps.device, dtype=torch.int64)
    layer = torch.arange(num_layers, device=stamps.device, dtype=torch.int64)
    x = stamps[None, :, None] * 2654435761 + col[None, None, :] * 40503 + layer[:, None, None] * 977
    x = (x ^ (x >> 13)) % 4093
    return ((x - 2046).to(torch.float32) / 1024).to(dtype)


@dataclass
class StampedPool:
    """A ``KVPool`` whose rows are ``stamped_rows`` of known stamps, with churn operations.

    stamps[r]: the stamp of each of request r's positions (host list, as the table's slots).
    """

    pool: KVPool
    rng: random.Random
    stamps: dict[int, list[int]] = field(default_factory=dict)
    next_stamp: int = 1
    next_request: int = 1

    @staticmethod
    def make(num_layers: int, num_slots: int, row_dim: int, dtype: torch.dtype, device: torch.device,
             max_requests: int, max_context: int, seed: int) -> "StampedPool":
        pool = KVPool(num_layers, num_slots, row_dim, dtype, device, max_requests=max_requests, max_context=max_context)
        return StampedPool(pool, random.Random(seed))

    def _write(self, slots: list[int]) -> list[int]:
        stamps = list(range(self.next_stamp, self.next_stamp + len(slots)))
        self.next_stamp += len(slots)
        kv = self.pool.kv
        index = torch.tensor(slots, dtype=torch.int64, device=kv.device)
        rows = stamped_rows(torch.tensor(stamps, dtype=torch.int64, device=kv.device), kv.shape[0], kv.shape[2], kv.dtype)
        kv.index_copy_(1, index, rows)
        return stamps

    def grow(self, req: int, n: int) -> bool:
        """Append ``n`` freshly written rows to ``req`` (a new request if unknown); False when they do not fit."""
        table = self.pool.table
        if n > self.pool.allocator.num_free or table.length(req) + n > table.max_context:
            return False
        if req not in table and len(table.requests()) >= table.max_requests:
            return False
        table.add(req)
        slots = self.pool.alloc(n)
        self.stamps.setdefault(req, []).extend(self._write(slots))
        table.append(req, slots)
        return True

    def new_request(self, n: int) -> int | None:
        req = self.next_request
        self.next_request += 1
        return req if self.grow(req, n) else None

    def finish(self, req: int) -> None:
        self.pool.release_request(req)
        self.stamps.pop(req, None)

    def churn(self, finish: float, grow: tuple[int, int], new_lengths: list[int]) -> None:
        """One round: each live request finishes with probability ``finish``, else grows by a
        random count in ``grow``; then requests of ``new_lengths`` arrive (as room allows)."""
        for req in self.pool.table.requests():
            if self.rng.random() < finish:
                self.finish(req)
            else:
                self.grow(req, self.rng.randint(*grow))
        for n in new_lengths:
            self.new_request(n)

    def scatter_free_stack(self) -> None:
        """Take every free slot and give them back in a random order (the LIFO then hands out
        scattered slots, as after long churn)."""
        alloc = self.pool.allocator
        slots = alloc.alloc(alloc.num_free)
        self.rng.shuffle(slots)
        alloc.free(slots)

    def check(self, reserved: int = 0) -> dict[str, int]:
        """Byte-for-byte and bookkeeping checks over every live request.

        corrupted_rows: positions whose row differs from its stamp's, plus positions where the
        device slot table differs from the host list (the kernel would read a wrong row), plus
        slots owned twice. leaked_slots: |allocated slots - owned slots - ``reserved``|.
        """
        pool, table = self.pool, self.pool.table
        kv = pool.kv
        reqs = table.requests()
        lengths = np.asarray([table.length(r) for r in reqs], dtype=np.int64)
        total = int(lengths.sum())
        slots = np.fromiter(itertools.chain.from_iterable(table.slots(r) for r in reqs), np.int64, total)
        stamps = np.fromiter(itertools.chain.from_iterable(self.stamps[r] for r in reqs), np.int64, total)
        corrupted = int(np.count_nonzero(np.bincount(slots, minlength=pool.num_slots) > 1)) if total else 0
        if reqs:  # the device table's rows against the host lists, in one read
            rows = torch.tensor([table.row(r) for r in reqs], dtype=torch.int64, device=table.rows.device)
            width = int(lengths.max())
            device = table.rows.index_select(0, rows)[:, :width].cpu().numpy()
            corrupted += int((device[np.arange(width)[None, :] < lengths[:, None]] != slots).sum())
        word = torch.int16 if kv.element_size() == 2 else torch.int32
        for c0 in range(0, total, CHECK_ROWS):
            index = torch.from_numpy(slots[c0 : c0 + CHECK_ROWS]).to(kv.device)
            expect = stamped_rows(torch.from_numpy(stamps[c0 : c0 + CHECK_ROWS]).to(kv.device), kv.shape[0],
                                  kv.shape[2], kv.dtype)
            got = kv.index_select(1, index)
            corrupted += int((got.view(word) != expect.view(word)).any(dim=2).any(dim=0).sum())
        slots = slots.tolist()
        leaked = abs(pool.allocator.capacity - pool.allocator.num_free - len(slots) - reserved)
        return {"corrupted_rows": corrupted, "leaked_slots": leaked, "live_rows": len(slots)}


@dataclass
class AttentionBatch:
    """A verify call over live requests: the last ``T_b`` positions of each are its drafts.

    q: [N, H, D]; qo_indptr, kv_indptr: int32 [B+1] (host); tree_mask: bool [sum T_b^2];
    requests: the request ids in batch order."""

    requests: list[int]
    q: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    tree_mask: torch.Tensor


def attention_batch(pool: KVPool, requests: list[int], num_heads: int, rng: random.Random, max_draft: int = 8) -> AttentionBatch:
    """Random drafts (T_b in 1..max_draft, random trees) and q for ``requests``."""
    device = pool.kv.device
    t = [min(rng.randint(1, max_draft), pool.table.length(r)) for r in requests]
    lengths = [pool.table.length(r) for r in requests]
    masks = [tree_mask_from_parents([rng.randint(-1, i - 1) for i in range(n)]).reshape(-1) for n in t]
    gen = torch.Generator(device="cpu").manual_seed(rng.randint(0, 1 << 30))
    q = (torch.randn(sum(t), num_heads, pool.kv.shape[2], generator=gen) * 0.5).to(device=device, dtype=pool.kv.dtype)
    qo = torch.tensor([0] + list(_cumsum(t)), dtype=torch.int32)
    kv = torch.tensor([0] + list(_cumsum(lengths)), dtype=torch.int32)
    return AttentionBatch(list(requests), q, qo, kv, torch.cat(masks).to(torch.bool).to(device))


def kv_indices(pool: KVPool, requests: list[int]) -> torch.Tensor:
    """int32 [sum L_b] on the pool's device: each request's slots from the device slot table."""
    return torch.cat([pool.table.device_slots(r) for r in requests])


def _cumsum(values):
    total = 0
    for v in values:
        total += v
        yield total
