"""Block-FP8 weight-streaming GEMM under its first name: ``w8_linear`` runs ``stream_gemm``'s
kernel with a dot tiling of 128-deep K blocks, for callers that name a tiling by its parts
(``phases/backend/bench/fp8_gemm.py``, the tests). ``gemm.linear`` calls ``stream_gemm`` itself.
"""

from __future__ import annotations

import torch

from serving.quant import stream_gemm
from serving.quant.fp8 import BlockFP8Weight
from serving.quant.stream_gemm import SCALE_BLOCK, StreamConfig


def w8_linear(x: torch.Tensor, w: BlockFP8Weight, out: torch.Tensor | None = None, block_n: int = 64,
              programs: int = 264, num_warps: int = 4) -> torch.Tensor:
    """x [M, K] (M <= stream_gemm.MAX_ROWS, unit column stride) times block-FP8 ``w`` [N, K] transposed -> [M, N] in x's dtype.

    out: [M, N] contiguous, x's dtype, written whole. programs: the grid size split-K aims at.
    """
    config = StreamConfig(block_n=block_n, block_k=SCALE_BLOCK, num_warps=num_warps,
                          num_stages=stream_gemm.DEFAULT_FP8.num_stages, programs=programs, dot=True)
    return stream_gemm.stream_linear(x, w, config, out=out)
