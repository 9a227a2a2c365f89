"""Rotary position embeddings of DeepSeek-V3: default and yarn, interleaved or half-split layout.

Decisions:
- Tables are built in float32 on the model's device and grown on demand; positions past the
  table are computed, never clamped.
- Yarn follows transformers' ``_compute_yarn_parameters``: blended inverse frequencies and an
  ``attention_factor`` multiplied into cos/sin; the softmax scale's ``mscale_all_dim``
  correction is :func:`softmax_scale`'s job.
"""

from __future__ import annotations

import math

import torch

from serving.configs.model import ModelConfig, RopeConfig


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def softmax_scale(cfg: ModelConfig) -> float:
    """qk_head_dim^-0.5, times yarn's mscale(factor, mscale_all_dim)^2 when that is set."""
    scale = cfg.qk_head_dim**-0.5
    if cfg.rope.rope_type == "yarn" and cfg.rope.mscale_all_dim:
        m = yarn_mscale(cfg.rope.factor, cfg.rope.mscale_all_dim)
        scale *= m * m
    return scale


def inverse_frequencies(rope: RopeConfig, dim: int) -> tuple[torch.Tensor, float]:
    """fp32 [dim // 2] inverse frequencies and the cos/sin attention factor."""
    pos_freqs = rope.theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    if rope.rope_type == "default":
        return 1.0 / pos_freqs, 1.0
    factor = rope.factor
    if rope.attention_factor is not None:
        attention_factor = float(rope.attention_factor)
    elif rope.mscale and rope.mscale_all_dim:
        attention_factor = yarn_mscale(factor, rope.mscale) / yarn_mscale(factor, rope.mscale_all_dim)
    else:
        attention_factor = yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(rope.original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv, attention_factor


class RotaryEmbedding:
    """cos/sin tables for ``qk_rope_head_dim`` and their application to q and k.

    apply(x, positions): x [N, ..., rope_dim] with positions int64 [N]; returns x's dtype.
    """

    def __init__(self, cfg: ModelConfig, device: torch.device) -> None:
        self.dim = cfg.qk_rope_head_dim
        self.interleave = cfg.rope_interleave
        inv, self.attention_factor = inverse_frequencies(cfg.rope, self.dim)
        self.inv_freq = inv.to(device)
        self.device = device
        self._cos = torch.empty(0, self.dim // 2, device=device)
        self._sin = torch.empty(0, self.dim // 2, device=device)

    def _grow(self, length: int) -> None:
        size = max(length, 2 * self._cos.shape[0], 4096)
        freqs = torch.arange(size, device=self.device, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        self._cos = freqs.cos() * self.attention_factor
        self._sin = freqs.sin() * self.attention_factor

    @property
    def size(self) -> int:
        """Positions the tables cover (``[0, size)``)."""
        return self._cos.shape[0]

    def ensure(self, length: int) -> None:
        """Make the tables cover positions ``[0, length)`` (host-side, no device sync)."""
        if length > self._cos.shape[0]:
            self._grow(length)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin: ``dtype`` [N, rope_dim // 2] for int64 positions [N] (gathered once per step)."""
        return self._cos.index_select(0, positions).to(dtype), self._sin.index_select(0, positions).to(dtype)

    def apply(self, x: torch.Tensor, positions: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """Rotate ``x`` [N, ..., rope_dim]; positions must be covered by ``ensure`` (the model calls
        it once per step); ``tables`` from :meth:`tables` skips the gather."""
        cos, sin = tables if tables is not None else self.tables(positions, x.dtype)
        shape = (positions.shape[0],) + (1,) * (x.dim() - 2) + (self.dim // 2,)
        cos, sin = cos.view(shape), sin.view(shape)
        if self.interleave:
            x1, x2 = x[..., 0::2], x[..., 1::2]
        else:
            x1, x2 = x[..., : self.dim // 2], x[..., self.dim // 2 :]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
