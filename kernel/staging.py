"""Pinned host staging for plan uploads: pack on the host, one asynchronous copy to the device.

Decisions:
- A ring of pinned buffers, each with the event of the copy that last read it: a plan is packed
  while earlier launches (and the copy of the previous plan, queued behind them) may still be
  pending, so a single buffer would make every ``plan()`` wait for the device. A buffer is only
  rewritten once its event has completed, which the ring makes rare.
- One ring per device, shared by every wrapper and the one-call API; buffers grow on demand
  (powers of two) and are kept.
- On a CPU device nothing is pinned or copied: the packed array is the plan buffer.
"""

from __future__ import annotations

import threading

import torch

from kernel.plan import MLAVerifyPlan, PlanLayout, next_pow2

RING = 8


class PlanStaging:
    """Uploads packed plans to one CUDA device through a ring of ``RING`` pinned buffers."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._buffers: list[torch.Tensor | None] = [None] * RING
        self._events: list[torch.cuda.Event | None] = [None] * RING
        self._next = 0
        self._lock = threading.Lock()

    def upload(self, plan: MLAVerifyPlan, layout: PlanLayout, into: torch.Tensor | None = None) -> torch.Tensor:
        """Copy ``plan`` packed in ``layout`` into ``into`` (int32 [>= numel] on the device, kept) or
        a new device buffer; returns that buffer. Asynchronous: no host sync unless all ``RING``
        earlier uploads are still queued behind device work."""
        numel = layout.numel
        with self._lock:
            k = self._next
            self._next = (k + 1) % RING
            event = self._events[k]
            if event is not None and not event.query():
                event.synchronize()
            buffer = self._buffers[k]
            if buffer is None or buffer.numel() < numel:
                buffer = torch.empty(next_pow2(max(numel, 1024)), dtype=torch.int32, pin_memory=True)
                self._buffers[k] = buffer
            layout.pack(plan, into=buffer.numpy())
            target = torch.empty(numel, dtype=torch.int32, device=self.device) if into is None else into
            target[:numel].copy_(buffer[:numel], non_blocking=True)
            if event is None:
                event = self._events[k] = torch.cuda.Event()
            event.record()
        return target


_STAGING: dict[torch.device, PlanStaging] = {}


def upload_plan(plan: MLAVerifyPlan, layout: PlanLayout, device: torch.device, into: torch.Tensor | None = None) -> torch.Tensor:
    """``plan`` packed in ``layout`` on ``device``: in ``into`` (int32 [>= layout.numel], kept, as
    CUDA graphs need) or a new buffer. One host-to-device copy, asynchronous on CUDA."""
    if device.type != "cuda":
        host = torch.from_numpy(layout.pack(plan))
        if into is None:
            return host
        into[: layout.numel].copy_(host)
        return into
    staging = _STAGING.get(device)
    if staging is None:
        staging = _STAGING.setdefault(device, PlanStaging(device))
    return staging.upload(plan, layout, into)
