"""Fused elementwise kernels of a decode step: RMSNorm (with the residual add before it), a
layer's attention inputs (the rotary embedding of q's rope heads into the attention's input, and
the KV-pool row: the latent's norm, the roped shared key beside it, the store at the token's
slot) and the MLP's SiLU(gate) * up.

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
- The attention inputs are one kernel: q's rope heads go straight into the rope columns of the
  absorbed attention's ``[N, H, rank + R]`` input, whose latent columns the W_UK product fills
  (``torch.bmm(..., out=)``), so no concatenation copies the input; the shared key is rotated
  in registers on its way into the pool row (the norm, the concatenation and ``index_copy_``
  of the torch path). Three kernels of a layer become one (a rotation, a row write and the
  input's concatenation before), 122 of a 61-layer step's; the activation is one kernel where
  torch runs two.
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
def _rope_and_kv_row_kernel(Q, q_stride_n, q_stride_h, QOut, qo_stride_n, qo_stride_h, Latent, latent_stride, W, Cos, Sin,
                            Slots, Pool, pool_stride, heads, half, rank, eps,
                            INTERLEAVE: tl.constexpr, NORM_DTYPE: tl.constexpr,
                            BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_live = d < half
    if INTERLEAVE:
        first, second = 2 * d, 2 * d + 1
    else:
        first, second = d, d + half
    cos = tl.load(Cos + token * half + d, mask=d_live, other=0.0).to(tl.float32)
    sin = tl.load(Sin + token * half + d, mask=d_live, other=0.0).to(tl.float32)
    q_dt = QOut.dtype.element_ty

    # q's rope heads, rotated in float32 and rounded once, into the attention's input
    h = tl.arange(0, BLOCK_H)[:, None]
    live = (h < heads) & d_live[None, :]
    q_row = Q + token * q_stride_n + h * q_stride_h
    x1 = tl.load(q_row + first[None, :], mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(q_row + second[None, :], mask=live, other=0.0).to(tl.float32)
    out_row = QOut + token * qo_stride_n + h * qo_stride_h
    tl.store(out_row + d[None, :], (x1 * cos[None, :] - x2 * sin[None, :]).to(q_dt), mask=live)
    tl.store(out_row + half + d[None, :], (x2 * cos[None, :] + x1 * sin[None, :]).to(q_dt), mask=live)

    # the pool row at the token's slot: [rms_norm(latent), the shared key rotated as q's heads are]
    slot = tl.load(Slots + token).to(tl.int64)
    pool_row = Pool + slot * pool_stride
    pool_dt = Pool.dtype.element_ty
    key = Latent + token * latent_stride + rank
    k1 = tl.load(key + first, mask=d_live, other=0.0).to(tl.float32)
    k2 = tl.load(key + second, mask=d_live, other=0.0).to(tl.float32)
    tl.store(pool_row + rank + d, (k1 * cos - k2 * sin).to(q_dt).to(NORM_DTYPE).to(pool_dt), mask=d_live)
    tl.store(pool_row + rank + half + d, (k2 * cos + k1 * sin).to(q_dt).to(NORM_DTYPE).to(pool_dt), mask=d_live)
    cols = tl.arange(0, BLOCK_R)
    c_live = cols < rank
    x = tl.load(Latent + token * latent_stride + cols, mask=c_live, other=0.0)
    xf = x.to(tl.float32)
    scale = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / rank + eps)
    normed = (xf * scale).to(x.dtype)
    w = tl.load(W + cols, mask=c_live, other=0.0)
    c_kv = (w.to(tl.float32) * normed.to(tl.float32)).to(NORM_DTYPE)  # rms_norm's output dtype, then the pool's
    tl.store(pool_row + cols, c_kv.to(pool_dt), mask=c_live)


_TRITON_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def rope_and_kv_rows(q_rope: torch.Tensor, q_out: torch.Tensor, pool_rows: torch.Tensor, slots: torch.Tensor,
                     latent: torch.Tensor, rank: int, weight: torch.Tensor, eps: float, cos: torch.Tensor,
                     sin: torch.Tensor, interleave: bool) -> None:
    """A layer's attention inputs in one kernel: q's rope heads rotated into ``q_out``, and each
    token's pool row ``[rms_norm(latent[:, :rank], weight), rope(latent[:, rank:])]`` written at
    its slot.

    q_rope: [N, H, R] (q's rope heads; any row and head strides, unit last stride);
    q_out: [N, H, R] in q_rope's dtype, same strides rule (the rope columns of the absorbed
    attention's input, so no concatenation follows); pool_rows: [S, rank + R];
    slots: [N] integer; latent: [N, rank + R] (the kv_a projection's row: latent, then the
    shared key; unit last stride); weight: [rank]; cos, sin: [N, R / 2] contiguous.

    The values are those of ``RotaryEmbedding.apply`` on ``cat([q_rope, key[:, None]], 1)``
    (rotated in float32, rounded once to q's dtype) followed by
    ``pool_rows.index_copy_(0, slots, cat([rms_norm(latent[:, :rank], weight, eps), key_roped], -1))``;
    as there, a slot named twice gets one of its rows."""
    n, heads, width = q_rope.shape
    half = width // 2
    if q_out.shape != q_rope.shape or q_out.dtype != q_rope.dtype:
        raise ValueError(f"Expected q_out of shape {tuple(q_rope.shape)} and dtype {q_rope.dtype}, "
                         f"got {tuple(q_out.shape)} and {q_out.dtype}")
    if q_rope.stride(-1) != 1 or q_out.stride(-1) != 1 or latent.stride(-1) != 1:
        raise ValueError(f"Expected unit last strides, got q_rope {q_rope.stride()}, q_out {q_out.stride()}, "
                         f"latent {latent.stride()}")
    if latent.shape != (n, rank + width) or pool_rows.shape[1] != rank + width:
        raise ValueError(f"Expected latent [{n}, {rank + width}] and pool rows of {rank + width} (latent {rank} + "
                         f"key {width}), got latent {tuple(latent.shape)} and pool rows of {pool_rows.shape[1]}")
    if slots.shape != (n,) or cos.shape != (n, half) or sin.shape != (n, half):
        raise ValueError(f"Expected slots [{n}] and cos, sin [{n}, {half}], got {tuple(slots.shape)}, "
                         f"{tuple(cos.shape)} and {tuple(sin.shape)}")
    norm_dtype = torch.promote_types(torch.promote_types(weight.dtype, latent.dtype), q_rope.dtype)
    if n:
        _rope_and_kv_row_kernel[(n,)](
            q_rope, q_rope.stride(0), q_rope.stride(1), q_out, q_out.stride(0), q_out.stride(1), latent, latent.stride(0),
            weight, cos.contiguous(), sin.contiguous(), slots, pool_rows, pool_rows.stride(0), heads, half, rank, eps,
            INTERLEAVE=interleave, NORM_DTYPE=_TRITON_DTYPES[norm_dtype], BLOCK_H=triton.next_power_of_2(heads),
            BLOCK_D=triton.next_power_of_2(half), BLOCK_R=triton.next_power_of_2(rank), num_warps=4)


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
