"""Weight-streaming GEMM for decode and verify rows: ``y = x @ w^T`` with x [M <= 64, K] in
bf16 / fp16 / fp32 and w either dense [N, K] in x's dtype or block FP8 (q float8_e4m3fn [N, K],
scale float32 [ceil(N/128), ceil(K/128)]).

At a few rows a linear layer is bound by the bytes of its weight. Each program owns BLOCK_N
output columns and walks its share of K one BLOCK_K block at a time (loads pipelined over
``num_stages``), accumulating in float32; a ``StreamConfig`` names the tiling, and
``stream_tuning`` holds the measured one per device, projection and row count.

Decisions:
- Two tilings in one kernel. ``dot=True``: the tensor cores' dot over BLOCK_M = max(16,
  next_pow2(M)) rows, the padding rows masked to zero; from two rows up it costs no more than
  one. ``dot=False`` ("row sum", M == 1 only): the weight tile times the one row broadcast,
  summed along K on the CUDA cores in float32. At one row the dot wastes 15 of its 16 rows'
  registers and shared memory on padding, and the row sum keeps more bytes in flight per SM:
  it is the faster tiling at M == 1 on the H100 (``tuned/``).
- The FP8 block scale multiplies the tile's float32 partial product, not each weight: q
  converts exactly to the activations' dtype (e4m3 fits bf16 / fp16 / fp32), so the tile's
  product needs one multiply per output instead of one per weight, and the weights enter the
  product unrounded (``fp8.dequantize`` rounds ``q * s`` to the activations' dtype). A FP8
  tile lies in one 128-row scale block (BLOCK_N divides 128); BLOCK_K is a multiple of 128,
  each 128-wide sub-block taking its own scale.
- Split-K (programs along K, at most one per K block) fills the SMs where N / BLOCK_N programs
  alone would not. The float32 partials are summed inside the kernel by the last program of
  each N tile to arrive (an arrival counter per tile, ``tl.atomic_add``), in split order, so
  the sum is deterministic and a GEMM is one kernel (a torch sum after took a reduction and a
  conversion kernel per GEMM: 610 of a ``dsv3-tp8-fp8`` step's 1864 kernels, H100 2026-12-06).
- The arrival counters live in one zeroed int32 buffer per device, and the last program resets
  its tile's counter, so the buffer is zero again when the kernel ends: a captured CUDA graph
  replays the same addresses. GEMMs that use it run one after another (one stream, as the
  engine's steps do); GEMMs on concurrent streams of one device would need their own counters.
- float32 activations use an IEEE dot (the CPU interpreter's tests, exact fp32 models); bf16
  and fp16 use the tensor cores with float32 accumulation.
- The measured table stops at 16 rows (decode steps and verify trees of a few requests): past
  that a dot tile of 32+ rows is a different kernel to tune, and cuBLAS / the FP8 default
  tiling serve those rows (``gemm.linear``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from serving.quant.fp8 import FP8_DTYPE, BlockFP8Weight

MAX_ROWS = 64  # the kernel's largest M (a dot tile of 64 rows)
SCALE_BLOCK = 128  # block-FP8 scale blocks are 128 x 128
ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _is_pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


@dataclass(frozen=True)
class StreamConfig:
    """One tiling of the streaming kernel.

    block_n: output columns per program (power of two; >= 16 with ``dot``).
    block_k: K per loop step (power of two, >= 16).
    num_warps: warps per program (1 .. 32, power of two).
    num_stages: K steps in flight (the loop's software pipeline, 1 .. 8).
    programs: the grid size split-K aims at (programs along K = programs // N tiles, >= 1).
    dot: the tensor cores' dot over padded rows, else the row sum (M == 1 only).
    """

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    programs: int
    dot: bool

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k", "num_warps", "num_stages", "programs"):
            value = getattr(self, name)
            if type(value) is not int:
                raise ValueError(f"Expected {name} as an int, got {value!r}")
        if type(self.dot) is not bool:
            raise ValueError(f"Expected dot as a bool, got {self.dot!r}")
        if not _is_pow2(self.block_n) or self.block_n > 256 or (self.dot and self.block_n < 16):
            raise ValueError(f"Expected block_n a power of two in [{16 if self.dot else 1}, 256], got {self.block_n}")
        if not _is_pow2(self.block_k) or not 16 <= self.block_k <= 1024:
            raise ValueError(f"Expected block_k a power of two in [16, 1024], got {self.block_k}")
        if not _is_pow2(self.num_warps) or self.num_warps > 32:
            raise ValueError(f"Expected num_warps a power of two in [1, 32], got {self.num_warps}")
        if not 1 <= self.num_stages <= 8:
            raise ValueError(f"Expected num_stages in [1, 8], got {self.num_stages}")
        if self.programs < 1:
            raise ValueError(f"Expected programs >= 1, got {self.programs}")

    def describe(self) -> str:
        return (f"n{self.block_n} k{self.block_k} w{self.num_warps} s{self.num_stages} p{self.programs} "
                f"{'dot' if self.dot else 'rowsum'}")


def fp8_tiling_problem(config: StreamConfig) -> str | None:
    """Why ``config`` cannot stream a block-FP8 weight (None: it can): a tile needs one scale per
    128-wide sub-block of K and one scale row along N."""
    if config.block_k % SCALE_BLOCK or SCALE_BLOCK % config.block_n:
        return (f"for fp8 block_k a multiple of {SCALE_BLOCK} and block_n dividing {SCALE_BLOCK}, "
                f"got block_k {config.block_k} block_n {config.block_n}")
    return None


# What ``fp8_gemm.w8_linear`` ran before the table: a 64-wide dot tile, 128-deep K blocks.
DEFAULT_FP8 = StreamConfig(block_n=64, block_k=128, num_warps=4, num_stages=3, programs=264, dot=True)


@triton.jit
def _stream_gemm_kernel(X, stride_xm, W, stride_wn, S, Out, Partial, Counter, M, N, K, s_cols, split_k,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SUB_K: tl.constexpr,
                        NUM_STAGES: tl.constexpr, DOT: tl.constexpr, FP8: tl.constexpr, IEEE: tl.constexpr):
    # SUB_K: 128 for FP8 (one scale per sub-block), BLOCK_K for dense weights
    tl.static_assert(BLOCK_K % SUB_K == 0)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, SUB_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    num_kb = tl.cdiv(K, BLOCK_K)
    scale_row = (pid_n * BLOCK_N) // 128  # FP8: the N tile lies inside one 128-row scale block
    w_rows = W + cols[:, None].to(tl.int64) * stride_wn
    for kb in tl.range(pid_k, num_kb, split_k, num_stages=NUM_STAGES):
        for sub in tl.static_range(BLOCK_K // SUB_K):
            k = kb * BLOCK_K + sub * SUB_K + ks
            x = tl.load(X + rows[:, None] * stride_xm + k[None, :], mask=(rows[:, None] < M) & (k[None, :] < K), other=0.0)
            w = tl.load(w_rows + k[None, :], mask=(cols[:, None] < N) & (k[None, :] < K), other=0.0)  # [BLOCK_N, SUB_K]
            if DOT:
                w = w.to(x.dtype)  # exact for e4m3
                if IEEE:
                    part = tl.dot(x, tl.trans(w), input_precision="ieee")
                else:
                    part = tl.dot(x, tl.trans(w))
            else:  # one row: products and their sum on the CUDA cores, in float32
                part = tl.sum(w.to(tl.float32) * x.to(tl.float32), axis=1)[None, :]
            if FP8:
                s_col = kb * (BLOCK_K // SUB_K) + sub
                part = part * tl.load(S + scale_row * s_cols + s_col, mask=s_col < s_cols, other=0.0)
            acc += part
    tile = rows[:, None] * N + cols[None, :]
    valid = (rows[:, None] < M) & (cols[None, :] < N)
    if split_k == 1:
        tl.store(Out + tile, acc.to(Out.dtype.element_ty), mask=valid)
    else:
        tl.store(Partial + pid_k * M * N + tile, acc, mask=valid)
        tl.debug_barrier()  # every thread's partial stored before the release below
        arrived = tl.atomic_add(Counter + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == split_k - 1:  # the tile's last program: sum the partials in split order
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for part_index in range(split_k):
                total += tl.load(Partial + part_index * M * N + tile, mask=valid, other=0.0, cache_modifier=".cg")
            tl.store(Out + tile, total.to(Out.dtype.element_ty), mask=valid)
            tl.atomic_xchg(Counter + pid_n, 0, sem="relaxed", scope="gpu")  # zero again for the next GEMM


COUNTERS: dict[torch.device, torch.Tensor] = {}


def arrival_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """int32 [>= tiles] zeros on ``device``: the split-K arrival counters (see Decisions). Grown
    (a new zeroed buffer) when a GEMM has more N tiles than the buffer holds; the old one stays
    valid for graphs captured over it."""
    counters = COUNTERS.get(device)
    if counters is None or counters.numel() < tiles:
        counters = torch.zeros(max(tiles, 1024), dtype=torch.int32, device=device)
        COUNTERS[device] = counters
    return counters


def split_k(n: int, k: int, block_n: int, block_k: int, programs: int) -> int:
    """Programs along K so that about ``programs`` run (at most one per K block)."""
    tiles = triton.cdiv(n, block_n)
    return max(1, min(triton.cdiv(k, block_k), programs // tiles))


def _check_inputs(x: torch.Tensor, w: torch.Tensor | BlockFP8Weight, config: StreamConfig) -> tuple[int, int, int]:
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"Expected x as [M, K] with unit column stride, got shape {tuple(x.shape)} strides {x.stride()}")
    m, k = x.shape
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"Expected 1 <= M <= {MAX_ROWS} rows for the streaming kernel, got {m}")
    if x.dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"Expected x in bf16, fp16 or fp32, got {x.dtype}")
    if isinstance(w, BlockFP8Weight):
        if w.q.dim() != 2 or w.q.shape[1] != k or w.q.dtype != FP8_DTYPE or w.block != SCALE_BLOCK:
            raise ValueError(f"Expected a block-{SCALE_BLOCK} float8_e4m3fn weight [N, {k}], got {w.q.dtype} "
                             f"{tuple(w.q.shape)} block {w.block}")
        problem = fp8_tiling_problem(config)
        if problem:
            raise ValueError(f"Expected {problem}")
        device = w.q.device
    elif isinstance(w, torch.Tensor):
        if w.dim() != 2 or w.shape[1] != k or w.dtype != x.dtype or (k > 1 and w.stride(-1) != 1):  # the kernel steps K by 1
            raise ValueError(f"Expected a dense {x.dtype} weight [N, {k}] with unit column stride, got {w.dtype} "
                             f"{tuple(w.shape)} strides {w.stride()}")
        device = w.device
    else:
        raise ValueError(f"Expected w as a torch.Tensor or BlockFP8Weight, got {type(w).__name__}")
    if device != x.device:
        raise ValueError(f"Expected x and w on one device, got {x.device} and {device}")
    if not config.dot and m != 1:
        raise ValueError(f"Expected M == 1 for the row-sum tiling (dot=False), got {m}")
    return m, w.shape[0], k


def stream_linear(x: torch.Tensor, w: torch.Tensor | BlockFP8Weight, config: StreamConfig | None = None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (1 <= M <= MAX_ROWS, unit column stride; bf16, fp16 or fp32) times w [N, K]
    transposed -> [M, N] in x's dtype (a bias is the caller's: ``gemm.linear`` adds it after).

    w: dense in x's dtype with unit column stride, or a ``BlockFP8Weight`` with 128 x 128 blocks.
    config: the tiling (default ``DEFAULT_FP8``). Rules beyond ``StreamConfig``'s own: for a
      block-FP8 weight block_k is a multiple of 128 and block_n divides 128 (a tile then needs
      one scale per 128-wide sub-block); ``dot=False`` (the row sum) takes exactly one row.
    out: [M, N] contiguous, x's dtype, written whole (callers' buffers, e.g. poisoned by tests).
    """
    config = config or DEFAULT_FP8
    m, n, k = _check_inputs(x, w, config)
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    elif tuple(out.shape) != (m, n) or out.dtype != x.dtype or not out.is_contiguous() or out.device != x.device:
        raise ValueError(f"Expected out as contiguous {x.dtype} [{m}, {n}] on {x.device}, got {out.dtype} "
                         f"{tuple(out.shape)} on {out.device}")
    fp8 = isinstance(w, BlockFP8Weight)
    if fp8:
        weight, scale = w.q.contiguous(), w.scale_inv.contiguous()
        stride_wn, s_cols = k, scale.shape[1]
    else:
        weight, scale = w, w  # no scales: the kernel never reads S
        stride_wn, s_cols = w.stride(0), 0
    tiles = triton.cdiv(n, config.block_n)
    splits = split_k(n, k, config.block_n, config.block_k, config.programs)
    partial = out if splits == 1 else torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
    counters = arrival_counters(x.device, tiles)
    block_m = max(16, triton.next_power_of_2(m)) if config.dot else 1
    _stream_gemm_kernel[(tiles, splits)](
        x, x.stride(0), weight, stride_wn, scale, out, partial, counters, m, n, k, s_cols, splits,
        BLOCK_M=block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        SUB_K=SCALE_BLOCK if fp8 else config.block_k, NUM_STAGES=config.num_stages, DOT=config.dot, FP8=fp8,
        IEEE=x.dtype == torch.float32, num_warps=config.num_warps, num_stages=config.num_stages)
    return out
