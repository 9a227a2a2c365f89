"""Roofline for MLA verify attention: ceilings measured in the same run, bytes and FLOPs per call.

    bytes = sum_b L_b * D * e  +  N * H * D * e  +  N * H * DV * e     (KV once, q, out; e = 2 for bf16)
    FLOPs = sum_b 2 * T_b * H * L_b * (D + DV)                           (Q.K^T and P.V over every key)
    time  = max(bytes / copy bandwidth, FLOPs / bf16 matmul rate)

The mask is ignored (every key counted); indices and metadata are not counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

COPY_BYTES = 1 << 30  # per buffer: ~2 GiB moved per copy (read + written)
MATMUL_SIZE = 8192


@dataclass(frozen=True)
class Ceilings:
    """Same-run hardware ceilings: D2D copy bandwidth (read + written) and bf16 matmul rate."""

    copy_bw_bytes_per_s: float
    bf16_flops_per_s: float


def measure_ceilings(device: torch.device | str = "cuda") -> Ceilings:
    """Time a ~2 GiB device-to-device copy and a bf16 8192^3 ``torch.mm`` (medians, L2 flushed).

    Uses random data (never zeros) so the matmul's power draw is realistic.
    """
    from triton.testing import (
        do_bench,  # GPU path only; keeps the arithmetic importable anywhere
    )

    device = torch.device(device)
    source = torch.randn(COPY_BYTES // 2, dtype=torch.bfloat16, device=device)  # [512 Mi] bf16
    target = torch.empty_like(source)
    copy_ms = do_bench(lambda: target.copy_(source), warmup=25, rep=200, return_mode="median")
    copy_bw = 2 * source.numel() * source.element_size() / (copy_ms * 1e-3)
    del source, target

    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, dtype=torch.bfloat16, device=device)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, dtype=torch.bfloat16, device=device)
    c = torch.empty(MATMUL_SIZE, MATMUL_SIZE, dtype=torch.bfloat16, device=device)
    mm_ms = do_bench(lambda: torch.mm(a, b, out=c), warmup=25, rep=200, return_mode="median")
    mm_flops = 2 * MATMUL_SIZE**3 / (mm_ms * 1e-3)
    return Ceilings(copy_bw_bytes_per_s=copy_bw, bf16_flops_per_s=mm_flops)


def mla_verify_bytes(
    context_lens: Sequence[int],
    draft_lens: Sequence[int],
    num_heads: int,
    head_dim: int = 576,
    v_head_dim: int = 512,
    element_bytes: int = 2,
) -> int:
    """Bytes one call must move: every request's KV rows once, plus q and out.

    Args:
        context_lens: ``[B]`` L_b.  draft_lens: ``[B]`` T_b.  num_heads: H.
        head_dim: D.  v_head_dim: DV.  element_bytes: 2 for bf16/fp16.
    """
    num_tokens = sum(draft_lens)
    kv_bytes = sum(context_lens) * head_dim * element_bytes
    q_bytes = num_tokens * num_heads * head_dim * element_bytes
    out_bytes = num_tokens * num_heads * v_head_dim * element_bytes
    return kv_bytes + q_bytes + out_bytes


def mla_verify_flops(
    context_lens: Sequence[int],
    draft_lens: Sequence[int],
    num_heads: int,
    head_dim: int = 576,
    v_head_dim: int = 512,
) -> int:
    """FLOPs of one call: ``sum_b 2 * T_b * H * L_b * (D + DV)`` (Q.K^T plus P.V, mask ignored)."""
    if len(context_lens) != len(draft_lens):
        raise ValueError(f"Expected one context per request, got {len(context_lens)} and {len(draft_lens)}")
    return sum(
        2 * num_draft * num_heads * context_len * (head_dim + v_head_dim)
        for context_len, num_draft in zip(context_lens, draft_lens)
    )


def roofline_time(num_bytes: float, flops: float, ceilings: Ceilings) -> float:
    """Seconds at the roofline: ``max(bytes / copy bandwidth, flops / bf16 rate)``."""
    return max(num_bytes / ceilings.copy_bw_bytes_per_s, flops / ceilings.bf16_flops_per_s)
