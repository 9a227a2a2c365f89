"""Weight-streaming block-FP8 GEMM for decode and verify rows: ``y = x @ dequant(q, scale)^T``
with x [M <= 64, K] in bf16 / fp16 / fp32, q float8_e4m3fn [N, K], scale float32 [ceil(N/128), ceil(K/128)].

At M <= 64 a linear layer is bound by the bytes of its weight; FP8 halves them. Each program
owns BLOCK_N output columns and walks its share of K one 128-wide block at a time: it loads the
FP8 tile once, dequantizes it in registers with the tile's one scale (``q.float() * s``, then
the activations' dtype, as ``fp8.dequantize`` computes it), and accumulates ``x @ w^T`` in float32.

Decisions:
- BLOCK_K is the scale block (128) and BLOCK_N divides it, so a tile needs exactly one scale.
- Split-K for small N (programs along K write float32 partials): it fills the SMs at B=1 where
  N / BLOCK_N programs alone would not. The partials are summed inside the kernel by the last
  program of each N tile to arrive (an arrival counter per tile, ``tl.atomic_add``), in split
  order, so the sum is deterministic, and a GEMM is one kernel: summing them after in torch
  took a reduction and a conversion kernel per GEMM, 610 of a ``dsv3-tp8-fp8`` step's 1864
  kernels and 1.1 of its 10.2 ms (H100, 2026-12-06).
- The arrival counters live in one zeroed int32 buffer per device, and the last program resets
  its tile's counter, so the buffer is zero again when the kernel ends: a captured graph
  replays the same addresses. GEMMs that use it run one after another (one stream, as the
  engine's steps do); GEMMs on concurrent streams of one device would need their own counters.
- float32 activations use an IEEE dot (the CPU interpreter's tests, exact fp32 models); bf16
  and fp16 use the tensor cores' dot with float32 accumulation.
- Not tuned yet: BLOCK_N, SPLIT_K and warps are first guesses to be measured on the H200
  against copy bandwidth on the FP8 bytes (target 0.85).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from serving.quant.fp8 import FP8_DTYPE, BlockFP8Weight

MAX_ROWS = 64  # the streaming kernel's M; larger batches dequantize (gemm.linear)
BLOCK_K = 128


@triton.jit
def _w8_stream_kernel(X, stride_xm, Q, S, Out, Partial, Counter, M, N, K, s_cols,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                      IEEE: tl.constexpr):
    # one scale per tile: the N tile lies inside one 128-row scale block
    tl.static_assert(BLOCK_K % BLOCK_N == 0)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    num_kb = tl.cdiv(K, BLOCK_K)
    scale_row = (pid_n * BLOCK_N) // BLOCK_K
    for kb in range(pid_k, num_kb, SPLIT_K):
        k = kb * BLOCK_K + ks
        x = tl.load(X + rows[:, None] * stride_xm + k[None, :], mask=(rows[:, None] < M) & (k[None, :] < K), other=0.0)
        q = tl.load(Q + cols[:, None].to(tl.int64) * K + k[None, :], mask=(cols[:, None] < N) & (k[None, :] < K), other=0.0)
        s = tl.load(S + scale_row * s_cols + kb)
        w = (q.to(tl.float32) * s).to(x.dtype)  # [BLOCK_N, BLOCK_K]
        if IEEE:
            acc += tl.dot(x, tl.trans(w), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w))
    tile = rows[:, None] * N + cols[None, :]
    valid = (rows[:, None] < M) & (cols[None, :] < N)
    if SPLIT_K == 1:
        tl.store(Out + tile, acc.to(Out.dtype.element_ty), mask=valid)
    else:
        tl.store(Partial + pid_k * M * N + tile, acc, mask=valid)
        tl.debug_barrier()  # every thread's partial stored before the release below
        arrived = tl.atomic_add(Counter + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:  # the tile's last program: sum the partials in split order
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for part in range(SPLIT_K):
                total += tl.load(Partial + part * M * N + tile, mask=valid, other=0.0, cache_modifier=".cg")
            tl.store(Out + tile, total.to(Out.dtype.element_ty), mask=valid)
            tl.atomic_xchg(Counter + pid_n, 0, sem="relaxed", scope="gpu")  # zero again for the next GEMM


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _arrival_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """int32 [>= tiles] zeros on ``device``: the split-K arrival counters (see Decisions). Grown
    (a new zeroed buffer) when a GEMM has more N tiles than the buffer holds; the old one stays
    valid for graphs captured over it."""
    counters = _COUNTERS.get(device)
    if counters is None or counters.numel() < tiles:
        counters = torch.zeros(max(tiles, 1024), dtype=torch.int32, device=device)
        _COUNTERS[device] = counters
    return counters


def split_k(n: int, k: int, block_n: int, programs: int) -> int:
    """Programs along K so that about ``programs`` run (at most one per K block)."""
    tiles = triton.cdiv(n, block_n)
    return max(1, min(triton.cdiv(k, BLOCK_K), programs // tiles))


def w8_linear(x: torch.Tensor, w: BlockFP8Weight, out: torch.Tensor | None = None, block_n: int = 64,
              programs: int = 264, num_warps: int = 4) -> torch.Tensor:
    """x [M, K] (M <= MAX_ROWS, unit column stride) times block-FP8 ``w`` [N, K] transposed -> [M, N] in x's dtype.

    out: [M, N] contiguous, x's dtype, written whole (callers' buffers, e.g. poisoned by tests).
    programs: the grid size split-K aims at (two per SM of an H200).
    """
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"Expected x as [M, K] with unit column stride, got shape {tuple(x.shape)} strides {x.stride()}")
    m, k = x.shape
    n = w.q.shape[0]
    if w.q.dim() != 2 or w.q.shape[1] != k or w.q.dtype != FP8_DTYPE or w.block != BLOCK_K:
        raise ValueError(f"Expected a block-{BLOCK_K} float8_e4m3fn weight [N, {k}], got {w.q.dtype} {tuple(w.q.shape)} block {w.block}")
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"Expected 1 <= M <= {MAX_ROWS} rows for the streaming kernel, got {m}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"Expected x in bf16, fp16 or fp32, got {x.dtype}")
    if BLOCK_K % block_n:
        raise ValueError(f"Expected block_n dividing {BLOCK_K}, got {block_n}")
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    elif tuple(out.shape) != (m, n) or out.dtype != x.dtype or not out.is_contiguous():
        raise ValueError(f"Expected out as contiguous {x.dtype} [{m}, {n}], got {out.dtype} {tuple(out.shape)}")
    q, scale = w.q.contiguous(), w.scale_inv.contiguous()
    splits = split_k(n, k, block_n, programs)
    tiles = triton.cdiv(n, block_n)
    partial = out if splits == 1 else torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
    counters = _arrival_counters(x.device, tiles)
    block_m = max(16, triton.next_power_of_2(m))
    _w8_stream_kernel[(tiles, splits)](x, x.stride(0), q, scale, out, partial, counters, m, n, k, scale.shape[1],
                                       BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=BLOCK_K, SPLIT_K=splits,
                                       IEEE=x.dtype == torch.float32, num_warps=num_warps)
    return out
