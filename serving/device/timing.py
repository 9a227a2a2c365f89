"""Wall-clock and CUDA-event timers for steps and the attention calls inside them."""

from __future__ import annotations

import time

import torch


class IntervalTimer:
    """Accumulates intervals between ``start()`` and ``stop()``; CUDA events on a GPU, perf_counter otherwise.

    ``total_s()`` synchronizes once and returns the summed seconds; ``reset()`` clears.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = torch.device(device).type == "cuda"
        self.enabled = False
        self._pairs: list = []
        self._open = None
        self._host_s = 0.0

    def start(self) -> None:
        if not self.enabled:
            return
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._open = ev
        else:
            self._open = time.perf_counter()

    def stop(self) -> None:
        if not self.enabled or self._open is None:
            return
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._pairs.append((self._open, ev))
        else:
            self._host_s += time.perf_counter() - self._open
        self._open = None

    def total_s(self) -> float:
        if self.cuda:
            if self._pairs:
                self._pairs[-1][1].synchronize()
            return sum(a.elapsed_time(b) for a, b in self._pairs) / 1e3
        return self._host_s

    def reset(self) -> None:
        self._pairs.clear()
        self._open = None
        self._host_s = 0.0


def synchronize(device: torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
