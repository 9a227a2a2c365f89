"""Boundary checks for the public kernel API.

Every public entry point validates through these helpers so a caller gets one kind of
message: ``ValueError("Expected <what>, got <what>")``. Only cheap metadata is checked
(shapes, dtypes, devices, strides); value checks that would need a device sync (index
ranges, tree-mask contents) are the caller's contract.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
INDEX_DTYPES = (torch.int32, torch.int64)
MAX_HEAD_DIM = 576
MAX_DRAFT = 64


@dataclass(frozen=True)
class VerifyShapes:
    """Sizes read off validated inputs.

    num_tokens: N, rows of q.  num_heads: H.  head_dim: D.  v_head_dim: DV.
    batch: B.  num_slots: rows of the KV pool.
    """

    num_tokens: int
    num_heads: int
    head_dim: int
    v_head_dim: int
    batch: int
    num_slots: int


def _expect(condition: bool, what: str, got: object) -> None:
    if not condition:
        raise ValueError(f"Expected {what}, got {got}")


def kv_rows(kv_cache: torch.Tensor) -> torch.Tensor:
    """View ``kv_cache`` ([num_slots, D] or [num_slots, 1, D]) as [num_slots, D]."""
    if kv_cache.dim() == 3:
        _expect(kv_cache.shape[1] == 1, "kv_cache of shape [num_slots, 1, D] (page_size=1)", tuple(kv_cache.shape))
        return kv_cache[:, 0, :]
    _expect(kv_cache.dim() == 2, "kv_cache of shape [num_slots, D] or [num_slots, 1, D]", tuple(kv_cache.shape))
    return kv_cache


def check_dims(head_dim: int, v_head_dim: int) -> None:
    """D and DV: multiples of 16, 16 <= DV <= D <= 576."""
    _expect(head_dim % 16 == 0 and 16 <= head_dim <= MAX_HEAD_DIM, f"head_dim a multiple of 16 in [16, {MAX_HEAD_DIM}]", head_dim)
    _expect(
        v_head_dim % 16 == 0 and 16 <= v_head_dim <= head_dim,
        f"v_head_dim a multiple of 16 in [16, head_dim={head_dim}]",
        v_head_dim,
    )


def check_inputs(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    tree_mask: torch.Tensor | None,
    v_head_dim: int,
    out: torch.Tensor | None,
) -> VerifyShapes:
    """Validate the arguments of :func:`kernel.mla_verify_attention` and return their sizes.

    q: [N, H, D] bf16/fp16.  kv_cache: [num_slots, D] or [num_slots, 1, D], q's dtype.
    qo_indptr, kv_indptr: int32 [B+1], on q's device or the host.  kv_indices: int32/int64 [total].
    tree_mask: bool/uint8 [sum_b T_b^2] or None.  out: [N, H, v_head_dim], q's dtype, or None.
    """
    shapes = check_planned_inputs(q, kv_cache, kv_indices, tree_mask, v_head_dim, out)
    for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr)):
        _expect(t.dim() == 1 and t.numel() >= 2, f"{name} of shape [B+1] with B >= 1", tuple(t.shape))
        _expect(t.dtype == torch.int32, f"{name}.dtype == torch.int32", t.dtype)
        _expect(t.device == q.device or t.device.type == "cpu", f"{name} on q's device ({q.device}) or the host", t.device)
    _expect(qo_indptr.numel() == kv_indptr.numel(), f"kv_indptr of shape [B+1] = {tuple(qo_indptr.shape)} like qo_indptr", tuple(kv_indptr.shape))
    return VerifyShapes(shapes.num_tokens, shapes.num_heads, shapes.head_dim, v_head_dim, qo_indptr.numel() - 1, shapes.num_slots)


def check_planned_inputs(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    kv_indices: torch.Tensor,
    tree_mask: torch.Tensor | None,
    v_head_dim: int,
    out: torch.Tensor | None,
) -> VerifyShapes:
    """Validate the tensors of ``MLAVerifyWrapper.run`` (shapes and dtypes only: no host sync).

    Shapes as in :func:`check_inputs`; the returned ``batch`` is 0 (the plan knows it).
    """
    _expect(q.dim() == 3, "q of shape [N, H, D]", tuple(q.shape))
    _expect(q.dtype in SUPPORTED_DTYPES, "q.dtype in (torch.bfloat16, torch.float16)", q.dtype)
    n, h, d = q.shape
    _expect(h >= 1, "at least one head in q ([N, H, D] with H >= 1)", tuple(q.shape))
    _expect(q.stride(2) == 1, "q contiguous in its last dimension (stride 1)", q.stride())
    rows = kv_rows(kv_cache)
    _expect(rows.dtype == q.dtype, f"kv_cache.dtype == q.dtype ({q.dtype})", rows.dtype)
    _expect(rows.shape[1] == d, f"kv_cache rows of length D={d} (q's last dimension)", rows.shape[1])
    _expect(rows.stride(1) == 1, "kv_cache contiguous in its last dimension (stride 1)", rows.stride())
    check_dims(d, v_head_dim)
    _expect(kv_indices.dim() == 1, "kv_indices of shape [total]", tuple(kv_indices.shape))
    _expect(kv_indices.dtype in INDEX_DTYPES, "kv_indices.dtype in (torch.int32, torch.int64)", kv_indices.dtype)
    if tree_mask is not None:
        _expect(tree_mask.dim() == 1, "tree_mask of shape [sum_b T_b*T_b] (flattened row-major blocks)", tuple(tree_mask.shape))
        _expect(tree_mask.dtype in (torch.bool, torch.uint8), "tree_mask.dtype in (torch.bool, torch.uint8)", tree_mask.dtype)
    if out is not None:
        _expect(tuple(out.shape) == (n, h, v_head_dim), f"out of shape {(n, h, v_head_dim)} ([N, H, v_head_dim])", tuple(out.shape))
        _expect(out.dtype == q.dtype, f"out.dtype == q.dtype ({q.dtype})", out.dtype)
        _expect(out.stride(2) == 1, "out contiguous in its last dimension (stride 1)", out.stride())
    tensors = [("kv_cache", kv_cache), ("kv_indices", kv_indices)]
    if tree_mask is not None:
        tensors.append(("tree_mask", tree_mask))
    if out is not None:
        tensors.append(("out", out))
    for name, t in tensors:
        _expect(t.device == q.device or t.device.type == "cpu", f"{name} on q's device ({q.device}) or the host", t.device)
    return VerifyShapes(n, h, d, v_head_dim, 0, rows.shape[0])


def check_lengths(qo_lens: list[int], kv_lens: list[int]) -> None:
    """Per-request lengths (read on the host, checked once per plan): 1 <= T_b <= 64, T_b <= L_b."""
    for b, (t, l) in enumerate(zip(qo_lens, kv_lens)):
        _expect(1 <= t <= MAX_DRAFT, f"1 <= T_b <= {MAX_DRAFT} draft tokens for request {b} (qo_indptr[{b}+1] - qo_indptr[{b}])", t)
        _expect(l >= t, f"L_b >= T_b for request {b} (its last T_b KV slots are its draft tokens; T_b={t})", l)


def check_sizes(
    num_tokens: int, total_kv: int, mask_numel: int, q_rows: int, num_indices: int, tree_mask_numel: int | None,
    padded: bool = False,
) -> None:
    """A run's tensor sizes against its plan's totals: N = sum_b T_b, sum_b L_b <= kv_indices.numel(),
    and a tree mask of sum_b T_b^2 elements. ``padded`` (CUDA-graph runs over static buffers): q and
    the tree mask may be longer than the plan needs; rows past N are neither read nor written."""
    if padded:
        _expect(num_tokens <= q_rows, f"qo_indptr[-1] <= q.shape[0] ({q_rows}) for a padded (CUDA-graph) run", num_tokens)
    else:
        _expect(num_tokens == q_rows, f"qo_indptr[-1] == N == q.shape[0] ({q_rows})", num_tokens)
    _expect(total_kv <= num_indices, f"kv_indptr[-1] <= kv_indices.numel() ({num_indices})", total_kv)
    if tree_mask_numel is not None:
        if padded:
            _expect(mask_numel <= tree_mask_numel, f"tree_mask with at least sum_b T_b^2 = {mask_numel} elements", tree_mask_numel)
        else:
            _expect(tree_mask_numel == mask_numel, f"tree_mask with sum_b T_b^2 = {mask_numel} elements", tree_mask_numel)
