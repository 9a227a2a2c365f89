"""The engine's portable decode / verify attention: gather, float32 scores, softmax, values.

This is what ``--backend reference`` (and every CPU run) computes. It is the engine's own code,
not the kernel's test oracle (``kernel.reference``): the oracle stays in tests and gates, where
it judges this path and the kernel alike.

Decisions:
- float32 throughout whatever the pool's dtype: the path exists to be the plain, exact side of
  the engine's comparisons (the ``greedy`` gate's oracle run).
- Heads go in groups whose score tensor fits ``SCORE_BYTES`` (``serving.model.limits``
  counts it), so a 185k context does not need a score tensor per head at once.
- Lengths come from the host copies of the indptrs: the path adds no host sync to a step.
"""

from __future__ import annotations

import torch

SCORE_BYTES = 512 << 20  # one head group's float32 scores [T, heads, L]


def latent_attention(
    q: torch.Tensor,
    rows: torch.Tensor,
    qo_bounds: list[int],
    kv_bounds: list[int],
    kv_indices: torch.Tensor,
    tree_mask: torch.Tensor | None,
    sm_scale: float,
    v_head_dim: int,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """Absorbed MLA attention over a page_size=1 pool, per request.

    q: [N, H, D] with N = qo_bounds[-1]; rows: [slots, D] (one layer of the pool);
    qo_bounds, kv_bounds: host lists [B+1]; request b's slots are
    kv_indices[kv_bounds[b]:kv_bounds[b+1]] in position order, the last T_b its new tokens.
    tree_mask: bool [sum T_b^2] (row-major [T_b, T_b] blocks) or None for causal new tokens.
    Returns [N, H, v_head_dim] in ``out_dtype``.
    """
    n, num_heads, head_dim = q.shape
    out = torch.empty(n, num_heads, v_head_dim, dtype=out_dtype, device=q.device)
    flat_mask = None if tree_mask is None else tree_mask.reshape(-1).to(torch.bool)
    mask_at = 0
    for b in range(len(qo_bounds) - 1):
        t = qo_bounds[b + 1] - qo_bounds[b]
        length = kv_bounds[b + 1] - kv_bounds[b]
        if t < 1 or length < t:
            raise ValueError(f"Expected 1 <= T_b <= L_b for request {b}, got T_b={t}, L_b={length}")
        kv = rows[kv_indices[kv_bounds[b] : kv_bounds[b + 1]].long()].to(torch.float32)  # [L, D]
        visible = torch.ones(t, length, dtype=torch.bool, device=q.device)
        if flat_mask is None:
            visible[:, length - t :] = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        else:
            visible[:, length - t :] = flat_mask[mask_at : mask_at + t * t].view(t, t)
            mask_at += t * t
        qb = q[qo_bounds[b] : qo_bounds[b + 1]].to(torch.float32)
        group = max(1, min(num_heads, SCORE_BYTES // max(1, t * length * 4)))
        hidden = ~visible[:, None, :]
        for h0 in range(0, num_heads, group):
            h1 = min(num_heads, h0 + group)
            scores = (qb[:, h0:h1].reshape(-1, head_dim) @ kv.T).view(t, h1 - h0, length)
            scores.mul_(sm_scale).masked_fill_(hidden, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            out[qo_bounds[b] : qo_bounds[b + 1], h0:h1] = (probs.view(-1, length) @ kv[:, :v_head_dim]).view(
                t, h1 - h0, v_head_dim).to(out_dtype)
    return out
