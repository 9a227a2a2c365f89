"""The kernel tests' oracle, written independently of the kernel (flash-attention style): the
attention of each request computed directly, in float64 or in the inputs' own precision."""

from __future__ import annotations

import torch


def reference(q, kv, qo_indptr, kv_indptr, kv_indices, masks, sm_scale, v_head_dim, dtype=torch.float64):
    """The oracle, written independently of the kernel, computed in ``dtype`` (float64, or q's
    dtype for the same-precision reference). masks: list of bool [T_b, T_b] or None (causal)."""
    qo, kvp = qo_indptr.tolist(), kv_indptr.tolist()
    outs = []
    for b in range(len(qo) - 1):
        qb = q[qo[b] : qo[b + 1]].to(dtype)  # [T, H, D]
        rows = kv[kv_indices[kvp[b] : kvp[b + 1]].long()].to(dtype)  # [L, D]
        t, length = qb.shape[0], rows.shape[0]
        visible = torch.ones(t, length, dtype=torch.bool, device=q.device)
        visible[:, length - t :] = masks[b] if masks is not None else torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        scores = torch.einsum("thd,ld->thl", qb, rows) * sm_scale
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        outs.append(torch.softmax(scores, dim=-1) @ rows[:, :v_head_dim])
    return torch.cat(outs)


def random_tree(t: int, gen: torch.Generator) -> torch.Tensor:
    """bool [t, t]: u visible from s iff u is s or an ancestor of s in a random tree."""
    parents = [-1] + [int(torch.randint(-1, i, (1,), generator=gen)) for i in range(1, t)]
    mask = torch.zeros(t, t, dtype=torch.bool)
    for s in range(t):
        u = s
        while u >= 0:
            mask[s, u] = True
            u = parents[u]
    return mask
