"""The KV pool: one latent row per token slot (page_size=1), its allocator and slot table.

Decisions:
- Slot 0 is never handed out: padding entries of index tensors may point at it safely.
- Freed slots go on a LIFO stack and are handed out first, so a long run interleaves the
  slots of different requests the way a busy server does (no request stays contiguous).
- ``alloc(n)`` is all-or-nothing; ``free`` validates every slot before freeing any, so a bad
  call leaves the allocator unchanged.
"""

from __future__ import annotations

import torch


class PoolExhausted(RuntimeError):
    """``alloc(n)`` asked for more slots than are free."""


class SlotAllocator:
    """Free-slot bookkeeping for slots 1 .. num_slots-1 (0 is padding)."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 2:
            raise ValueError(f"Expected num_slots >= 2 (slot 0 is reserved), got {num_slots}")
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, 0, -1))  # pop() hands out 1, 2, 3, ... first
        self._is_free = bytearray([0]) + bytearray([1]) * (num_slots - 1)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def capacity(self) -> int:
        """Slots that can ever be allocated (num_slots - 1)."""
        return self.num_slots - 1

    def alloc(self, n: int) -> list[int]:
        """``n`` free slots, or PoolExhausted and nothing allocated."""
        if n < 0:
            raise ValueError(f"Expected n >= 0 slots, got {n}")
        if n > len(self._free):
            raise PoolExhausted(f"pool exhausted: asked {n}, free {len(self._free)}")
        slots = [self._free.pop() for _ in range(n)]
        for s in slots:
            self._is_free[s] = 0
        return slots

    def free(self, slots: list[int]) -> None:
        """Return allocated slots; raises ValueError (freeing nothing) on a double free or a foreign slot."""
        seen = set()
        for s in slots:
            if not isinstance(s, int) or not 0 < s < self.num_slots:
                raise ValueError(f"Expected slots in [1, {self.num_slots - 1}] from this pool, got foreign slot {s!r}")
            if self._is_free[s] or s in seen:
                raise ValueError(f"Expected allocated slots, got double free of slot {s}")
            seen.add(s)
        for s in slots:
            self._is_free[s] = 1
            self._free.append(s)


class SlotTable:
    """Request id -> its slots in position order (slot of position p at index p).

    Kept twice: a host list (lengths, freeing) and a device int32 row per request
    (``device_slots``), grown by doubling, so a step's ``kv_indices`` is a device concatenation
    instead of a host list of every cached token.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self._slots: dict[int, list[int]] = {}
        self._rows: dict[int, torch.Tensor] = {}

    def __contains__(self, req_id: int) -> bool:
        return req_id in self._slots

    def slots(self, req_id: int) -> list[int]:
        return self._slots[req_id]

    def length(self, req_id: int) -> int:
        return len(self._slots.get(req_id, ()))

    def device_slots(self, req_id: int) -> torch.Tensor:
        """int32 [L] on the pool's device: the request's slots in position order."""
        return self._rows[req_id][: len(self._slots[req_id])]

    def append(self, req_id: int, slots: list[int]) -> None:
        host = self._slots.setdefault(req_id, [])
        start, end = len(host), len(host) + len(slots)
        row = self._rows.get(req_id)
        if row is None or row.numel() < end:
            grown = torch.empty(max(end, 2 * (0 if row is None else row.numel()), 64), dtype=torch.int32, device=self.device)
            if row is not None:
                grown[:start] = row[:start]
            self._rows[req_id] = row = grown
        if slots:
            row[start:end] = torch.tensor(slots, dtype=torch.int32).to(self.device, non_blocking=True)
        host.extend(slots)

    def release(self, req_id: int) -> list[int]:
        """Forget a request; returns its slots (the caller frees them)."""
        self._rows.pop(req_id, None)
        return self._slots.pop(req_id, [])

    def live_slots(self) -> int:
        return sum(len(s) for s in self._slots.values())


class KVPool:
    """Latent rows of every layer: ``kv`` [num_layers, num_slots, row_dim] plus allocator and table.

    row_dim = kv_lora_rank + qk_rope_head_dim (576 for DeepSeek-V3): normalized latent, then roped key.
    """

    def __init__(self, num_layers: int, num_slots: int, row_dim: int, dtype: torch.dtype, device: torch.device | str) -> None:
        self.kv = torch.zeros(num_layers, num_slots, row_dim, dtype=dtype, device=device)
        self.allocator = SlotAllocator(num_slots)
        self.table = SlotTable(device)

    @property
    def num_slots(self) -> int:
        return self.kv.shape[1]

    @property
    def dtype(self) -> torch.dtype:
        return self.kv.dtype

    def layer(self, i: int) -> torch.Tensor:
        """[num_slots, row_dim] view of layer ``i``."""
        return self.kv[i]

    def alloc(self, n: int) -> list[int]:
        return self.allocator.alloc(n)

    def free(self, slots: list[int]) -> None:
        self.allocator.free(slots)

    def release_request(self, req_id: int) -> None:
        """Free every slot of a request and forget it."""
        self.allocator.free(self.table.release(req_id))

    def leaked_slots(self) -> int:
        """Allocated slots that no request owns (0 when the engine is idle and clean)."""
        return self.allocator.capacity - self.allocator.num_free - self.table.live_slots()
