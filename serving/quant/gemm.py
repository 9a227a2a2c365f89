"""The model's GEMMs over dense or block-FP8 weights: one dispatch point for every projection.

Decisions:
- Decode and verify rows (1 <= M <= 16) on CUDA look their GEMM up in the measured table
  (``stream_tuning``, keyed by weight kind, N, K and M rounded up to a power of two): a tiling
  runs the weight-streaming kernel (``stream_gemm.stream_linear``), "torch" runs ``F.linear``
  (cuBLAS was the faster there). The table holds bf16 dense weights and FP8 weights under bf16
  activations, as measured; other dtypes, and shapes with no cell, keep the behaviour below.
- Without a cell a dense weight is ``F.linear``. A ``BlockFP8Weight`` on CUDA with at most
  ``stream_gemm.MAX_ROWS`` rows runs the streaming kernel's default tiling (``DEFAULT_FP8``),
  which reads the FP8 bytes once; more rows (prefill chunks) dequantize the weight to the
  activations' dtype and run the dense GEMM, whose cost is then the matmul, not the bytes.
  A block-scaled w8a8 GEMM (torch's ``_scaled_mm`` with blockwise scales, or a Triton kernel
  as SGLang and vLLM use) plugs in here once measured against that.
- On the CPU a ``BlockFP8Weight`` is dequantized per call: the loader dequantizes at load
  there (``weights.keep_fp8``), so this path runs only where a test keeps FP8 on purpose, and
  it computes exactly what the dequantized model computes.
- Stacked experts [E, out, in] (``expert_matmul``) dequantize their group per call; a grouped
  FP8 kernel is future work.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from serving.quant import stream_tuning
from serving.quant.fp8 import BlockFP8Weight, dense
from serving.quant.stream_gemm import DEFAULT_FP8, MAX_ROWS, StreamConfig, stream_linear

STREAMING_DEVICE_TYPES = ("cuda",)  # where the Triton kernel runs compiled (tests add "cpu": the interpreter)


def _table_choice(x: torch.Tensor, w: torch.Tensor | BlockFP8Weight) -> StreamConfig | str | None:
    """The measured choice for this GEMM, or None (not a table's shape, dtype or row count)."""
    if x.dtype != torch.bfloat16 or x.shape[0] > stream_tuning.ROW_BUCKETS[-1]:
        return None
    if isinstance(w, BlockFP8Weight):
        kind = "fp8"
    elif w.dtype == torch.bfloat16 and w.dim() == 2 and w.stride(-1) == 1:
        kind = "bf16"
    else:
        return None
    return stream_tuning.lookup(kind, w.shape[0], x.shape[1], x.shape[0], x.device)


def linear(x: torch.Tensor, w: torch.Tensor | BlockFP8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [N, in] @ w [out, in]^T (+ bias [out]) -> [N, out] in x's dtype."""
    fp8 = isinstance(w, BlockFP8Weight)
    streams = (x.device.type in STREAMING_DEVICE_TYPES and x.dim() == 2 and 1 <= x.shape[0] <= MAX_ROWS
               and x.stride(-1) == 1)
    if streams:
        choice = _table_choice(x, w)
        if fp8 or isinstance(choice, StreamConfig):  # FP8 cells always name a tiling; no cell: the default one
            y = stream_linear(x, w, choice if isinstance(choice, StreamConfig) else DEFAULT_FP8)
            return y if bias is None else y + bias
    if not fp8:
        return F.linear(x, w, bias)
    return F.linear(x, w.dequantize(x.dtype), bias)


def expert_matmul(x: torch.Tensor, w: torch.Tensor | BlockFP8Weight) -> torch.Tensor:
    """x [N, in] (or [G, N, in], one row group per expert) through each of the stacked experts
    w [G, out, in] -> [G, N, out]."""
    return torch.matmul(x, dense(w, x.dtype).transpose(1, 2))
