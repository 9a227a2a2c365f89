"""Fused elementwise kernels of a decode step: RMSNorm (with the residual add before it), the
rotary embedding of q's rope heads and the shared rope key, the KV-pool row write (the latent's
norm, the roped key beside it, the store at the token's slot) and the MLP's SiLU(gate) * up.

Inside a captured step every small kernel costs about as much as a launch (1.5-2 µs), and
a DeepSeek-V3 layer's norms and rope are ~35 of them in eager torch (RMSNorm alone is seven:
cast, square, mean, add, rsqrt, scale, cast, weight). One Triton program per row does each.

Decisions:
- The torch versions' arithmetic (``model.rms_norm``, ``rope.RotaryEmbedding.apply``): float32
  statistics, the normalized row cast to the input dtype before the weight multiplies it, the
  residual sum rounded to the input dtype. The rotation is computed in float32 and rounded
  once (torch rounds each product in a bf16 model: at most one bf16 ulp apart), and the order
  of the float32 norm sum differs. SiLU(gate) is rounded to the input dtype before it
  multiplies ``up``, as ``F.silu(gate) * up`` rounds it.
- The pool row write replaces three kernels (norm, concatenation, ``index_copy_``) and the
  activation two: 3 of a layer's kernels, 183 of a 61-layer step's.
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


@triton.jit
def _kv_row_kernel(Latent, latent_stride, W, Key, key_stride, Slots, Pool, pool_stride, rank, rope, eps,
                   NORM_DTYPE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(Slots + token).to(tl.int64)
    dt = Pool.dtype.element_ty
    cols = tl.arange(0, BLOCK_R)
    live = cols < rank
    x = tl.load(Latent + token * latent_stride + cols, mask=live, other=0.0)
    xf = x.to(tl.float32)
    scale = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / rank + eps)
    normed = (xf * scale).to(x.dtype)
    w = tl.load(W + cols, mask=live, other=0.0)
    c_kv = (w.to(tl.float32) * normed.to(tl.float32)).to(NORM_DTYPE)  # rms_norm's output dtype, then the pool's
    tl.store(Pool + slot * pool_stride + cols, c_kv.to(dt), mask=live)
    kcols = tl.arange(0, BLOCK_K)
    k = tl.load(Key + token * key_stride + kcols, mask=kcols < rope, other=0.0)
    tl.store(Pool + slot * pool_stride + rank + kcols, k.to(NORM_DTYPE).to(dt), mask=kcols < rope)


_TRITON_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def write_kv_rows(pool_rows: torch.Tensor, slots: torch.Tensor, latent: torch.Tensor, weight: torch.Tensor, eps: float,
                  key: torch.Tensor) -> None:
    """Write each token's latent row ``[rms_norm(latent, weight), key]`` into ``pool_rows``
    [S, rank + R] at its slot, in one kernel (the norm, the concatenation and the store).

    latent: [N, rank] (any row stride, unit column stride); key: [N, R] (the roped shared key,
    same); slots: [N] integer; weight: [rank]. The values are those of
    ``pool_rows.index_copy_(0, slots, torch.cat([rms_norm(latent, weight, eps), key], -1).to(pool_rows.dtype))``;
    as there, a slot named twice gets one of its rows."""
    n, rank = latent.shape
    rope = key.shape[1]
    if pool_rows.shape[1] != rank + rope:
        raise ValueError(f"Expected pool rows of {rank + rope} (latent {rank} + key {rope}), got {pool_rows.shape[1]}")
    if slots.shape != (n,) or key.shape[0] != n:
        raise ValueError(f"Expected slots [{n}] and key [{n}, R], got {tuple(slots.shape)} and {tuple(key.shape)}")
    norm_dtype = torch.promote_types(torch.promote_types(weight.dtype, latent.dtype), key.dtype)
    if n:
        _kv_row_kernel[(n,)](latent, latent.stride(0), weight, key, key.stride(0), slots, pool_rows, pool_rows.stride(0),
                             rank, rope, eps, NORM_DTYPE=_TRITON_DTYPES[norm_dtype],
                             BLOCK_R=triton.next_power_of_2(rank), BLOCK_K=triton.next_power_of_2(rope), num_warps=4)


@triton.jit
def _silu_mul_kernel(X, Out, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = cols < inter
    gate = tl.load(X + row * 2 * inter + cols, mask=live, other=0.0)
    up = tl.load(X + row * 2 * inter + inter + cols, mask=live, other=0.0)
    g = gate.to(tl.float32)
    act = (g / (1.0 + tl.exp(-g))).to(gate.dtype)  # F.silu rounds to the input dtype before the product
    tl.store(Out + row * inter + cols, (act.to(tl.float32) * up.to(tl.float32)).to(gate.dtype), mask=live)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` of ``gate, up = gate_up.chunk(2, -1)`` in one kernel.

    gate_up: [..., 2 * I] contiguous; returns [..., I] in its dtype."""
    if not gate_up.is_contiguous() or gate_up.shape[-1] % 2:
        raise ValueError(f"Expected a contiguous [..., 2 * I] tensor, got shape {tuple(gate_up.shape)}, "
                         f"strides {gate_up.stride()}")
    inter = gate_up.shape[-1] // 2
    out = torch.empty((*gate_up.shape[:-1], inter), dtype=gate_up.dtype, device=gate_up.device)
    rows = gate_up.numel() // max(1, 2 * inter)
    if rows and inter:
        block = min(1024, triton.next_power_of_2(inter))
        _silu_mul_kernel[(rows, triton.cdiv(inter, block))](gate_up, out, inter, BLOCK=block, num_warps=4)
    return out
