"""Naive reference for MLA verify attention: the oracle every kernel result is judged against.

The operation: for request ``b`` with KV slots ``s_0 .. s_{L-1}`` (the last ``T`` of them
are the request's draft tokens) and draft queries ``t = 0 .. T-1``::

    score[t, h, j] = sm_scale * dot(q[t, h, :], kv[s_j, :])              j < L
    visible(t, j)  = j < L - T  or  tree_mask_b[t, j - (L - T)]
    out[t, h, :]   = softmax_j(score over visible j) @ kv[s_j, :v_head_dim]

This module gathers each request's rows, upcasts them and evaluates the formula literally.
It is also the benchmark's "naive oracle" baseline (fp32 on the GPU), so it stays a plain
gather / matmul / softmax / matmul with no fused tricks; heads are processed in groups only
to bound the size of the temporaries.
"""

from __future__ import annotations

import math

import torch

from kernel.masks import causal_tree_mask, tree_mask_from_parents  # noqa: F401 (re-exported)

DEFAULT_CHUNK_BYTES = 512 << 20  # bytes of one head group's scores; about 3x this is live at once


def mla_verify_reference(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    tree_mask: torch.Tensor | None = None,
    sm_scale: float | None = None,
    v_head_dim: int = 512,
    *,
    compute_dtype: torch.dtype = torch.float32,
    out_dtype: torch.dtype | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> torch.Tensor:
    """MLA verify attention, evaluated naively per request.

    Args:
        q: bf16/fp16/fp32/fp64 ``[N, H, D]``; ``N = qo_indptr[-1]``.
        kv_cache: same dtype family ``[num_slots, D]`` or ``[num_slots, 1, D]``; one latent row
            per token slot.
        qo_indptr: int ``[B + 1]``; request ``b``'s drafts are ``q[qo_indptr[b]:qo_indptr[b + 1]]``
            (``T_b >= 1``). Both indptrs are read on the host: CPU tensors cost no device sync.
        kv_indptr: int ``[B + 1]``; request ``b``'s slots are
            ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]`` in position order (``L_b >= T_b``).
        kv_indices: int32/int64 ``[total_kv]``; the last ``T_b`` slots of request ``b`` hold its
            draft tokens.
        tree_mask: bool/uint8 ``[sum_b T_b * T_b]`` (request ``b``'s row-major ``[T_b, T_b]``
            block at offset ``sum_{c<b} T_c^2``; ``(t, u)`` true means draft ``t`` sees draft
            ``u``), or ``None`` for causal visibility among the drafts. The prefix is always
            visible.
        sm_scale: softmax scale; ``None`` means ``1 / sqrt(D)``.
        v_head_dim: ``DV <= D``; V is the first ``DV`` values of each row.
        compute_dtype: dtype of the gathered rows, scores, softmax and products
            (float32 for the benchmark baseline, float64 for verification).
        out_dtype: dtype of the result; ``None`` means ``q.dtype``.
        chunk_bytes: budget for one head group's ``[T, heads, L]`` score tensor; heads are
            processed in groups that fit it (at least one head per group).
    Returns:
        ``out_dtype`` ``[N, H, DV]``.
    """
    kv_rows = kv_cache.reshape(kv_cache.shape[0], -1) if kv_cache.dim() == 3 else kv_cache
    _check_reference_inputs(q, kv_rows, qo_indptr, kv_indptr, kv_indices, v_head_dim)
    num_tokens, num_heads, head_dim = q.shape
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    out = torch.empty(num_tokens, num_heads, v_head_dim, dtype=out_dtype or q.dtype, device=q.device)

    qo_bounds = qo_indptr.tolist()
    kv_bounds = kv_indptr.tolist()
    flat_mask = None if tree_mask is None else tree_mask.reshape(-1).to(torch.bool)
    mask_offset = 0
    for b in range(len(qo_bounds) - 1):
        q_start, q_end = qo_bounds[b], qo_bounds[b + 1]
        kv_start, kv_end = kv_bounds[b], kv_bounds[b + 1]
        num_draft, context_len = q_end - q_start, kv_end - kv_start
        if num_draft < 1 or context_len < num_draft:
            raise ValueError(
                f"Expected 1 <= T_b <= L_b for request {b}, got T_b={num_draft}, L_b={context_len}"
            )
        if flat_mask is None:
            draft_mask = causal_tree_mask(num_draft, q.device)  # built in place: no host-to-device copy
        else:
            block = flat_mask[mask_offset : mask_offset + num_draft * num_draft]
            if block.numel() != num_draft * num_draft:
                raise ValueError(f"tree_mask too short for request {b} (T_b={num_draft})")
            draft_mask = block.view(num_draft, num_draft).to(q.device)
            mask_offset += num_draft * num_draft
        visible = torch.ones(num_draft, context_len, dtype=torch.bool, device=q.device)  # [T, L]
        visible[:, context_len - num_draft :] = draft_mask

        slots = kv_indices[kv_start:kv_end].to(device=kv_rows.device, dtype=torch.long)
        kv = kv_rows[slots].to(compute_dtype)  # [L, D]
        out[q_start:q_end] = _attend_one_request(
            q[q_start:q_end].to(compute_dtype), kv, visible, scale, v_head_dim, chunk_bytes
        ).to(out.dtype)
    if flat_mask is not None and mask_offset != flat_mask.numel():
        raise ValueError(f"Expected tree_mask of {mask_offset} elements, got {flat_mask.numel()}")
    return out


def _attend_one_request(
    q: torch.Tensor,
    kv: torch.Tensor,
    visible: torch.Tensor,
    scale: float,
    v_head_dim: int,
    chunk_bytes: int,
) -> torch.Tensor:
    """Attention for one request.

    Args:
        q: compute dtype ``[T, H, D]``.
        kv: compute dtype ``[L, D]``, gathered in position order.
        visible: bool ``[T, L]``.
    Returns:
        compute dtype ``[T, H, DV]``.
    """
    num_draft, num_heads, head_dim = q.shape
    context_len = kv.shape[0]
    bytes_per_head = num_draft * context_len * kv.element_size()
    heads_per_group = max(1, min(num_heads, chunk_bytes // max(1, bytes_per_head)))
    values = kv[:, :v_head_dim]  # [L, DV]
    hidden = ~visible[:, None, :]  # [T, 1, L]
    result = torch.empty(num_draft, num_heads, v_head_dim, dtype=kv.dtype, device=kv.device)
    for head_start in range(0, num_heads, heads_per_group):
        head_end = min(num_heads, head_start + heads_per_group)
        q_group = q[:, head_start:head_end].reshape(-1, head_dim)  # [T * h, D]
        scores = (q_group @ kv.T).view(num_draft, head_end - head_start, context_len)  # [T, h, L]
        scores.mul_(scale).masked_fill_(hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        del scores
        result[:, head_start:head_end] = (probs.view(-1, context_len) @ values).view(
            num_draft, head_end - head_start, v_head_dim
        )
        del probs
    return result


def _check_reference_inputs(
    q: torch.Tensor,
    kv_rows: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    v_head_dim: int,
) -> None:
    """Raise ValueError on inputs whose shapes disagree (shapes as in ``mla_verify_reference``)."""
    if q.dim() != 3:
        raise ValueError(f"Expected q of shape [N, H, D], got {tuple(q.shape)}")
    if kv_rows.dim() != 2 or kv_rows.shape[1] != q.shape[2]:
        raise ValueError(
            f"Expected kv_cache of shape [num_slots, {q.shape[2]}] or [num_slots, 1, {q.shape[2]}], "
            f"got {tuple(kv_rows.shape)}"
        )
    if not 0 < v_head_dim <= q.shape[2]:
        raise ValueError(f"Expected 0 < v_head_dim <= {q.shape[2]}, got {v_head_dim}")
    if qo_indptr.dim() != 1 or qo_indptr.shape != kv_indptr.shape or qo_indptr.numel() < 2:
        raise ValueError(
            f"Expected qo_indptr and kv_indptr of shape [B + 1], got {tuple(qo_indptr.shape)} "
            f"and {tuple(kv_indptr.shape)}"
        )
    if int(qo_indptr[-1]) != q.shape[0]:
        raise ValueError(f"Expected qo_indptr[-1] == N == {q.shape[0]}, got {int(qo_indptr[-1])}")
    if int(kv_indptr[-1]) > kv_indices.numel():
        raise ValueError(
            f"Expected kv_indptr[-1] <= len(kv_indices) == {kv_indices.numel()}, got {int(kv_indptr[-1])}"
        )
