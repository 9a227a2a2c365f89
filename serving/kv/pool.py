"""The KV pool: one latent row per token slot (page_size=1), its allocator and slot table.

Decisions:
- Slot 0 is never handed out: padding entries of index tensors (a CUDA graph's padded
  tokens, the slot table's padding row) point at it safely.
- Freed slots go on a LIFO stack and are handed out first, so a long run interleaves the
  slots of different requests the way a busy server does (no request stays contiguous).
- ``alloc(n)`` is all-or-nothing; ``free`` validates every slot before freeing any, so a bad
  call leaves the allocator unchanged.
- The slot table is SGLang's ``ReqToTokenPool``: one int32 device tensor
  ``[max_requests + 1, max_context]``, a row per live request holding its slots in position
  order, row 0 all zeros (graph padding reads it). Its address never changes, so a captured
  step can build ``kv_indices`` from it on the device; the host keeps the same slots as lists
  (lengths, freeing) and every change goes to both.
- Row moves (``KVPool.move_rows``) and slot renames (``SlotTable.remap``) are the primitives a
  defragmenter composes; each validates everything before it changes anything.
- Large pools: the free stack drops taken slots lazily (``alloc`` skips slots that are no longer
  free, the stack is rebuilt when stale entries outnumber free ones), so ``relocate`` and
  ``reserve`` cost O(slots moved), not O(free slots); ``SlotTable.rename_at`` renames slots
  at known (request, position) pairs in O(slots renamed) where ``remap`` scans every live slot;
  ``free_mask`` gives the free set without walking the stack.
"""

from __future__ import annotations

from operator import itemgetter

import numpy as np
import torch


class PoolExhausted(RuntimeError):
    """``alloc(n)`` asked for more slots than are free."""


class TableFull(RuntimeError):
    """The slot table has no free row, or a request would outgrow ``max_context``."""


class SlotAllocator:
    """Free-slot bookkeeping for slots 1 .. num_slots-1 (0 is padding)."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 2:
            raise ValueError(f"Expected num_slots >= 2 (slot 0 is reserved), got {num_slots}")
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, 0, -1))  # pop() hands out 1, 2, 3, ... first
        self._is_free = bytearray([0]) + bytearray([1]) * (num_slots - 1)
        self._num_free = num_slots - 1  # _free may also hold stale entries (taken since pushed)

    @property
    def num_free(self) -> int:
        return self._num_free

    @property
    def capacity(self) -> int:
        """Slots that can ever be allocated (num_slots - 1)."""
        return self.num_slots - 1

    def is_free(self, slot: int) -> bool:
        return bool(self._is_free[slot])

    def free_mask(self) -> np.ndarray:
        """bool [num_slots]: which slots are free now (a copy: for planning and measuring over
        large pools, without ordering the free stack as ``free_slots`` does)."""
        return self._flags().astype(bool)

    def free_mask_of(self, slots: np.ndarray) -> np.ndarray:
        """bool [len(slots)]: which of these slots are free now."""
        return self._flags()[slots] != 0

    def free_slots(self) -> list[int]:
        """The free slots, in the order ``alloc`` would hand them out last-to-first."""
        if not self._free:
            return []
        top_down = np.asarray(self._free, dtype=np.int64)[::-1]  # the topmost entry of a slot is the live one
        _, first = np.unique(top_down, return_index=True)
        first.sort()
        live = top_down[first]
        live = live[self._flags()[live] != 0]
        return live[::-1].tolist()

    def _flags(self) -> np.ndarray:
        """uint8 [num_slots] view of the free flags (writes go through)."""
        return np.frombuffer(self._is_free, dtype=np.uint8)

    def _prune(self) -> None:
        """Rebuild the stack once stale entries outnumber the free slots (amortized O(1))."""
        if len(self._free) > 2 * self._num_free + 1024:
            self._free = self.free_slots()

    def alloc(self, n: int) -> list[int]:
        """``n`` free slots, or PoolExhausted and nothing allocated."""
        if n < 0:
            raise ValueError(f"Expected n >= 0 slots, got {n}")
        if n > self._num_free:
            raise PoolExhausted(f"pool exhausted: asked {n}, free {self._num_free}")
        slots = []
        while len(slots) < n:
            s = self._free.pop()
            if self._is_free[s]:  # else a stale entry: taken by relocate / reserve since
                self._is_free[s] = 0
                slots.append(s)
        self._num_free -= n
        return slots

    def reserve(self, slots: list[int]) -> None:
        """Take these specific free slots (a defragmenter's destinations), all or none:
        ValueError, reserving nothing, unless each is a free slot of this pool, listed once.
        They count as allocated until ``free`` returns them or ``relocate`` fills them."""
        if not (len(slots) > 64 and self._all_free(slots)):  # else the loop names the first bad slot
            seen = set()
            for s in slots:
                if not isinstance(s, int) or not 0 < s < self.num_slots or not self._is_free[s] or s in seen:
                    raise ValueError(f"Expected free slots of this pool, each once, got slot {s!r}")
                seen.add(s)
        self._flags()[np.asarray(slots, dtype=np.int64)] = 0
        self._num_free -= len(slots)

    def _distinct_slots(self, slots: list[int]) -> np.ndarray | None:
        """``slots`` as an array if they are integer slots of this pool, each once; else None.
        The vectorized checks of long lists use it (the loops name the first bad slot)."""
        a = np.asarray(slots)
        if a.dtype.kind not in "iu" or a.min() < 1 or a.max() >= self.num_slots or len(np.unique(a)) != len(a):
            return None
        return a

    def _all_free(self, slots: list[int]) -> bool:
        a = self._distinct_slots(slots)
        return a is not None and bool(self._flags()[a].all())

    def _all_owned(self, slots: list[int]) -> bool:
        a = self._distinct_slots(slots)
        return a is not None and not self._flags()[a].any()

    def _check_owned(self, slots: list[int]) -> None:
        if len(slots) > 64 and self._all_owned(slots):
            return  # else the loop below names the first bad slot
        seen = set()
        for s in slots:
            if not isinstance(s, int) or not 0 < s < self.num_slots:
                raise ValueError(f"Expected slots in [1, {self.num_slots - 1}] from this pool, got foreign slot {s!r}")
            if self._is_free[s] or s in seen:
                raise ValueError(f"Expected allocated slots, got double free of slot {s}")
            seen.add(s)

    def free(self, slots: list[int], checked: bool = False) -> None:
        """Return allocated slots; raises ValueError (freeing nothing) on a double free or a foreign slot.
        checked: the caller has just established that (a defragmenter's piece), so it is not checked again."""
        if not checked:
            self._check_owned(slots)
        if slots:
            self._flags()[np.asarray(slots, dtype=np.int64)] = 1
        self._free.extend(slots)
        self._num_free += len(slots)
        self._prune()

    def check_relocate(self, src: list[int], dst: list[int]) -> None:
        """ValueError unless ``relocate(src, dst)`` is valid: every source allocated, every
        destination free or vacated by the same call, no slot twice on either side."""
        if len(src) != len(dst):
            raise ValueError(f"Expected as many destinations as sources, got {len(dst)} and {len(src)}")
        self._check_owned(src)
        if len(dst) > 64 and self._all_fillable(src, dst):
            return  # else the loop below names the first bad destination
        vacated, seen = set(src), set()
        for d in dst:
            if not isinstance(d, int) or not 0 < d < self.num_slots:
                raise ValueError(f"Expected destination slots in [1, {self.num_slots - 1}], got {d!r}")
            if d in seen or not (self._is_free[d] or d in vacated):
                raise ValueError(f"Expected each destination free or vacated by this move, got slot {d}")
            seen.add(d)

    def _all_fillable(self, src: list[int], dst: list[int]) -> bool:
        """Whether every destination is a slot of this pool, once, free or among ``src``."""
        d = self._distinct_slots(dst)
        return d is not None and bool(((self._flags()[d] != 0) | np.isin(d, np.asarray(src))).all())

    def relocate(self, src: list[int], dst: list[int], checked: bool = False) -> None:
        """After rows moved from allocated ``src`` to ``dst`` (pairwise), mark ``dst``
        allocated and the vacated sources free (a slot may be both: a chain of moves).
        Validated first (``check_relocate``; not when the caller has just ``checked``): a bad
        call changes nothing."""
        if not checked:
            self.check_relocate(src, dst)
        src_set, dst_set = set(src), set(dst)
        freed, taken = src_set - dst_set, dst_set - src_set
        flags = self._flags()
        flags[list(freed)] = 1
        flags[list(taken)] = 0  # their stack entries go stale; alloc skips them
        self._free.extend(sorted(freed, reverse=True))
        self._num_free += len(freed) - len(taken)
        self._prune()


class SlotTable:
    """Request id -> its slots in position order (slot of position p at index p).

    rows: int32 [max_requests + 1, max_context] on the pool's device; a live request owns one
    row (1 ..), row 0 is padding (zeros). Host lists mirror the rows.
    """

    def __init__(self, max_requests: int, max_context: int, device: torch.device | str = "cpu") -> None:
        if max_requests < 1 or max_context < 1:
            raise ValueError(f"Expected max_requests >= 1 and max_context >= 1, got {max_requests} and {max_context}")
        self.device = torch.device(device)
        self.max_requests, self.max_context = max_requests, max_context
        self.rows = torch.zeros(max_requests + 1, max_context, dtype=torch.int32, device=self.device)
        self._slots: dict[int, list[int]] = {}
        self._row: dict[int, int] = {}
        self._free_rows = list(range(max_requests, 0, -1))

    def __contains__(self, req_id: int) -> bool:
        return req_id in self._slots

    def slots(self, req_id: int) -> list[int]:
        return self._slots[req_id]

    def length(self, req_id: int) -> int:
        return len(self._slots.get(req_id, ()))

    def row(self, req_id: int) -> int:
        """The request's row in ``rows`` (its slots are ``rows[row, :length]``)."""
        return self._row[req_id]

    def device_slots(self, req_id: int) -> torch.Tensor:
        """int32 [L] on the pool's device: the request's slots in position order."""
        return self.rows[self._row[req_id], : len(self._slots[req_id])]

    def add(self, req_id: int) -> None:
        """Give a new request an empty row; TableFull when every row is taken."""
        if req_id in self._slots:
            return
        if not self._free_rows:
            raise TableFull(f"slot table full: {self.max_requests} requests live; raise max_requests")
        self._row[req_id] = self._free_rows.pop()
        self._slots[req_id] = []

    def check_room(self, req_id: int, n: int) -> None:
        """TableFull unless the request can grow by ``n`` slots."""
        end = self.length(req_id) + n
        if end > self.max_context:
            raise TableFull(f"request {req_id} would hold {end} tokens, over the slot table's max_context {self.max_context}")

    def append(self, req_id: int, slots: list[int], on_device: bool = False) -> None:
        """Append slots in position order. ``on_device``: the device row was already written
        (a captured step writes accepted slots itself); only the host list changes."""
        self.add(req_id)
        self.check_room(req_id, len(slots))
        host = self._slots[req_id]
        if slots and not on_device:
            start = len(host)
            row = self.rows[self._row[req_id], start : start + len(slots)]
            row.copy_(torch.tensor(slots, dtype=torch.int32), non_blocking=True)
        host.extend(slots)

    def release(self, req_id: int) -> list[int]:
        """Forget a request; returns its slots (the caller frees them)."""
        row = self._row.pop(req_id, None)
        if row is not None:
            self._free_rows.append(row)
        return self._slots.pop(req_id, [])

    def check_remap(self, src: list[int], dst: list[int]) -> dict[int, int]:
        """ValueError unless every source is a slot of a live request and no slot repeats;
        returns the mapping source -> destination."""
        if len(src) != len(dst):
            raise ValueError(f"Expected as many destinations as sources, got {len(dst)} and {len(src)}")
        mapping = dict(zip(src, dst))
        if len(mapping) != len(src) or len(set(dst)) != len(dst):
            raise ValueError("Expected each source and each destination slot at most once")
        owned = {s for slots in self._slots.values() for s in slots}
        missing = [s for s in src if s not in owned]
        if missing:
            raise ValueError(f"Expected slots owned by live requests, got unowned slot(s) {missing[:5]}")
        return mapping

    def remap(self, src: list[int], dst: list[int]) -> list[int]:
        """Rename slot ``src[i]`` to ``dst[i]`` in every live request (rows moved in the pool).
        Validated first (``check_remap``); returns the requests changed, whose device rows are
        rewritten from their host lists."""
        mapping = self.check_remap(src, dst)
        changed = [r for r, slots in self._slots.items() if any(s in mapping for s in slots)]
        for r in changed:
            new = [mapping.get(s, s) for s in self._slots[r]]
            self._slots[r] = new
            self.rows[self._row[r], : len(new)].copy_(torch.tensor(new, dtype=torch.int32), non_blocking=True)
        return changed

    def check_rename_at(self, req_ids: list[int], positions: list[int], src: list[int]) -> None:
        """ValueError unless request ``req_ids[i]`` is live and holds slot ``src[i]`` at position
        ``positions[i]``, with no (request, position) pair twice."""
        if not len(req_ids) == len(positions) == len(src):
            raise ValueError(f"Expected as many requests, positions and slots, got {len(req_ids)}, {len(positions)}, {len(src)}")
        if len(src) > 64 and self._all_at(req_ids, positions, src):
            return  # else the loop below names the first bad one
        seen = set()
        for r, p, s in zip(req_ids, positions, src):
            slots = self._slots.get(r)
            if slots is None or not 0 <= p < len(slots) or slots[p] != s or (r, p) in seen:
                held = None if slots is None or not 0 <= p < len(slots) else slots[p]
                raise ValueError(f"Expected request {r} to hold slot {s} at position {p} (once), got {held}")
            seen.add((r, p))

    def _all_at(self, req_ids: list[int], positions: list[int], src: list[int]) -> bool:
        """Whether each (request, position) holds its slot, with no pair twice (per request, in C)."""
        reqs, pos, want = np.asarray(req_ids), np.asarray(positions), np.asarray(src)
        order = np.argsort(reqs, kind="stable")
        bounds = np.flatnonzero(np.diff(reqs[order])) + 1
        for at in np.split(order, bounds):
            r = int(reqs[at[0]])
            slots, p = self._slots.get(r), pos[at]
            if slots is None or p.min() < 0 or p.max() >= len(slots) or len(np.unique(p)) != len(p):
                return False
            held = itemgetter(*p.tolist())(slots) if len(p) > 1 else (slots[int(p[0])],)
            if not np.array_equal(np.asarray(held), want[at]):
                return False
        return True

    def rename_at(self, req_ids: list[int], positions: list[int], src: list[int], dst: list[int],
                  checked: bool = False) -> None:
        """Set position ``positions[i]`` of request ``req_ids[i]`` (holding ``src[i]``) to slot
        ``dst[i]``, on the device (one indexed write) and in the host lists. Validated first
        (``check_rename_at``; not when the caller has just ``checked``): a bad call changes
        nothing. O(slots renamed)."""
        if not checked:
            self.check_rename_at(req_ids, positions, src)
        if len(dst) != len(src):
            raise ValueError(f"Expected as many destinations as sources, got {len(dst)} and {len(src)}")
        if not dst:
            return
        flat = np.empty((2, len(dst)), dtype=np.int64)  # flat index into rows, then the new slot
        row_of = self._row
        flat[0] = np.fromiter((row_of[r] for r in req_ids), np.int64, len(req_ids)) * self.max_context + positions
        flat[1] = dst
        both = torch.from_numpy(flat).to(self.device, non_blocking=True)
        self.rows.view(-1).index_copy_(0, both[0], both[1].to(torch.int32))
        slots_of = self._slots
        for r, p, d in zip(req_ids, positions, dst):
            slots_of[r][p] = d

    def live_slots(self) -> int:
        return sum(len(s) for s in self._slots.values())

    def requests(self) -> list[int]:
        return list(self._slots)


class KVPool:
    """Latent rows of every layer: ``kv`` [num_layers, num_slots, row_dim] plus allocator and table.

    row_dim = kv_lora_rank + qk_rope_head_dim (576 for DeepSeek-V3): normalized latent, then roped key.
    max_requests, max_context: the slot table's rows and their width (default: up to 256
    concurrent requests of up to ``min(num_slots, 262144)`` tokens).
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        row_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        max_requests: int = 256,
        max_context: int | None = None,
    ) -> None:
        self.allocator = SlotAllocator(num_slots)
        self.kv = torch.zeros(num_layers, num_slots, row_dim, dtype=dtype, device=device)
        self.table = SlotTable(max_requests, max_context or min(num_slots, 1 << 18), device)

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

    def copy_rows(self, src: list[int] | torch.Tensor, dst: list[int] | torch.Tensor) -> None:
        """``kv[:, dst] = kv[:, src]`` over every layer (all sources are read before any
        destination is written, so overlapping or chained moves are safe)."""
        src_t = torch.as_tensor(src, dtype=torch.long).to(self.kv.device, non_blocking=True)
        dst_t = torch.as_tensor(dst, dtype=torch.long).to(self.kv.device, non_blocking=True)
        if src_t.shape != dst_t.shape:
            raise ValueError(f"Expected as many destinations as sources, got {dst_t.numel()} and {src_t.numel()}")
        self.kv[:, dst_t] = self.kv[:, src_t]

    def move_rows(self, src: list[int], dst: list[int]) -> None:
        """Move live rows ``src[i]`` -> ``dst[i]`` on every layer and rename them in the slot
        table and the allocator. Both bookkeepers validate before any byte moves, so a bad
        move leaves rows and bookkeeping unchanged."""
        self.allocator.check_relocate(src, dst)
        self.table.check_remap(src, dst)
        if not src:
            return
        self.copy_rows(src, dst)
        self.table.remap(src, dst)
        self.allocator.relocate(src, dst)

    def leaked_slots(self) -> int:
        """Allocated slots that no request owns (0 when the engine is idle and clean)."""
        return self.allocator.capacity - self.allocator.num_free - self.table.live_slots()
