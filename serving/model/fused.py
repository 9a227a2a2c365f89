"""Fused elementwise kernels of a decode step: RMSNorm (with the residual add before it) and the
rotary embedding of q's rope heads and the shared rope key.

Inside a captured step every small kernel costs about as much as a launch (1.5-2 µs), and
a DeepSeek-V3 layer's norms and rope are ~35 of them in eager torch (RMSNorm alone is seven:
cast, square, mean, add, rsqrt, scale, cast, weight). One Triton program per row does each.

Decisions:
- The torch versions' arithmetic (``model.rms_norm``, ``rope.RotaryEmbedding.apply``): float32
  statistics, the normalized row cast to the input dtype before the weight multiplies it, the
  residual sum rounded to the input dtype. The rotation is computed in float32 and rounded
  once (torch rounds each product in a bf16 model: at most one bf16 ulp apart), and the order
  of the float32 norm sum differs.
- CUDA tensors only (``available``); the CPU keeps the torch versions. Tests run these kernels
  under Triton's interpreter against them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def available(x: torch.Tensor) -> bool:
    return x.is_cuda


@triton.jit
def _rms_norm_kernel(X, x_stride, Res, res_stride, Sum, W, Out, n_cols, eps,
                     HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    live = cols < n_cols
    x = tl.load(X + row * x_stride + cols, mask=live, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(Res + row * res_stride + cols, mask=live, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # the sum, rounded as torch's add rounds it
        tl.store(Sum + row * n_cols + cols, x, mask=live)
    xf = x.to(tl.float32)
    scale = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / n_cols + eps)
    normed = (xf * scale).to(x.dtype)
    w = tl.load(W + cols, mask=live, other=0.0)
    tl.store(Out + row * n_cols + cols, (w.to(tl.float32) * normed.to(tl.float32)).to(Out.dtype.element_ty), mask=live)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """RMSNorm of the rows of ``x`` [N, C] (any row stride, unit column stride), or of
    ``x + residual`` when given. Returns the normalized rows [N, C] in ``weight * x``'s dtype,
    and with ``residual`` also the sum [N, C] in x's dtype."""
    n, c = x.shape
    out_dtype = torch.promote_types(weight.dtype, x.dtype)
    out = torch.empty((n, c), dtype=out_dtype, device=x.device)
    total = torch.empty((n, c), dtype=x.dtype, device=x.device) if residual is not None else out
    res = residual if residual is not None else x
    if n:
        _rms_norm_kernel[(n,)](x, x.stride(0), res, res.stride(0), total, weight, out, c, eps,
                               HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(c), num_warps=8)
    return (out, total) if residual is not None else out


@triton.jit
def _rope_kernel(Q, q_stride_n, q_stride_h, K, k_stride_n, Cos, Sin, Out, heads, half,
                 INTERLEAVE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    live = (h <= heads) & (d < half)  # rows 0..heads-1: q's heads, row heads: the shared key
    if INTERLEAVE:
        first, second = 2 * d, 2 * d + 1
    else:
        first, second = d, d + half
    is_q = h < heads
    q_row = Q + token * q_stride_n + h * q_stride_h
    k_row = K + token * k_stride_n + h * 0
    x1 = tl.where(is_q, tl.load(q_row + first, mask=live & is_q, other=0.0), tl.load(k_row + first, mask=live & ~is_q, other=0.0))
    x2 = tl.where(is_q, tl.load(q_row + second, mask=live & is_q, other=0.0), tl.load(k_row + second, mask=live & ~is_q, other=0.0))
    cos = tl.load(Cos + token * half + d, mask=d < half, other=0.0).to(tl.float32)
    sin = tl.load(Sin + token * half + d, mask=d < half, other=0.0).to(tl.float32)
    x1, x2 = x1.to(tl.float32), x2.to(tl.float32)
    out_row = Out + (token * (heads + 1) + h) * (2 * half)
    dt = Out.dtype.element_ty
    tl.store(out_row + d, (x1 * cos - x2 * sin).to(dt), mask=live)
    tl.store(out_row + half + d, (x2 * cos + x1 * sin).to(dt), mask=live)


def rope_q_and_key(q_rope: torch.Tensor, k_rope: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """Rotate q's rope heads ``q_rope`` [N, H, R] and the shared key ``k_rope`` [N, R] (views;
    unit last stride) with ``cos``/``sin`` [N, R/2] (contiguous, their dtype); returns
    [N, H + 1, R] like ``RotaryEmbedding.apply`` on their concatenation (key last)."""
    n, heads, width = q_rope.shape
    half = width // 2
    out = torch.empty((n, heads + 1, width), dtype=q_rope.dtype, device=q_rope.device)
    if n:
        _rope_kernel[(n,)](q_rope, q_rope.stride(0), q_rope.stride(1), k_rope, k_rope.stride(0), cos, sin, out, heads, half,
                           INTERLEAVE=interleave, BLOCK_H=triton.next_power_of_2(heads + 1), BLOCK_D=triton.next_power_of_2(half))
    return out
