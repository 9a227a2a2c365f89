"""The model's GEMMs over dense or block-FP8 weights: one dispatch point for every projection.

Decisions:
- A dense weight is ``F.linear`` as before. A ``BlockFP8Weight`` on CUDA with at most
  ``fp8_gemm.MAX_ROWS`` rows (decode and verify steps) runs the weight-streaming kernel,
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

from serving.quant import fp8_gemm
from serving.quant.fp8 import BlockFP8Weight, dense


def linear(x: torch.Tensor, w: torch.Tensor | BlockFP8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [N, in] @ w [out, in]^T (+ bias [out]) -> [N, out] in x's dtype."""
    if not isinstance(w, BlockFP8Weight):
        return F.linear(x, w, bias)
    if x.is_cuda and x.dim() == 2 and 1 <= x.shape[0] <= fp8_gemm.MAX_ROWS and x.stride(-1) == 1:
        y = fp8_gemm.w8_linear(x, w)
        return y if bias is None else y + bias
    return F.linear(x, w.dequantize(x.dtype), bias)


def expert_matmul(x: torch.Tensor, w: torch.Tensor | BlockFP8Weight) -> torch.Tensor:
    """x [N, in] (or [G, N, in], one row group per expert) through each of the stacked experts
    w [G, out, in] -> [G, N, out]."""
    return torch.matmul(x, dense(w, x.dtype).transpose(1, 2))
