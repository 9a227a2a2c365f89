"""Counter-based uniforms on the device: one per (seed, position, draw), whatever computes it.

A request's draw for choosing the token after position ``p`` is ``uniforms(seed, p, d)``: plain
sampling uses draw 0; speculative sampling tests a node's children with draws 1, 2, ... (their
order among siblings) and samples its residual with draw 0 (``serving.speculation.rejection``).

Decisions:
- No state: nothing to advance, capture or keep per request. A request's draws depend on its
  seed and its positions only, so it draws the same alone or in a batch, eagerly or in a
  replayed CUDA graph, and on every tensor-parallel rank (per-request ``torch.Generator``s
  cannot be captured per row).
- SplitMix64's finalizer (Steele, Lea and Flood 2014; ``java.util.SplittableRandom``'s mixer) in
  int64 tensor ops, three rounds: the seed, then the position (times the golden ratio), then the
  draw index. Multiplications and additions wrap modulo 2**64 (two's complement on the CPU and
  CUDA); right shifts are made logical with a mask. ``uniform_reference`` is the same in Python
  integers and the tests compare the two bit for bit.
- 24 bits per uniform: a float32 k / 2**24 in [0, 1), every value exact.
"""

from __future__ import annotations

import torch

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
BITS = 24


def _signed(c: int) -> int:
    """A 64-bit constant as the int64 with the same bits."""
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 ``x`` by ``k`` (torch's >> is arithmetic on signed ints)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def mix64(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finalizer over int64 ``z`` (any shape)."""
    z = (z ^ _shr(z, 30)) * _signed(MIX1)
    z = (z ^ _shr(z, 27)) * _signed(MIX2)
    return z ^ _shr(z, 31)


def uniforms(seed: torch.Tensor, position: torch.Tensor, draw: torch.Tensor | int) -> torch.Tensor:
    """float32 uniforms in [0, 1), shaped as ``seed``, ``position`` and ``draw`` broadcast together.

    seed, position: int64 (a request's seed, the position of the token the draw chooses after);
    draw: int64 or an int (the draw's index at that position).
    """
    h = mix64(seed + _signed(GOLDEN))
    h = mix64(h + position * _signed(GOLDEN))
    h = mix64(h + draw)
    return _shr(h, 64 - BITS).to(torch.float32) * (1.0 / (1 << BITS))


def _mix_reference(z: int) -> int:
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    return z ^ (z >> 31)


def uniform_reference(seed: int, position: int, draw: int) -> float:
    """``uniforms`` of one (seed, position, draw) in Python integers (the tests' reference)."""
    h = _mix_reference((seed + GOLDEN) & MASK64)
    h = _mix_reference((h + position * GOLDEN) & MASK64)
    h = _mix_reference((h + draw) & MASK64)
    return (h >> (64 - BITS)) / (1 << BITS)
