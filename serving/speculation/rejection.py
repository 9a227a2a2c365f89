"""Speculative sampling of a verified draft tree on the device (target-only recursive rejection
sampling, as SpecInfer and EAGLE; SGLang's ``tree_speculative_sampling_target_only``): the
emitted tokens follow exactly the distribution plain sampling gives, for every drafter.

The walk, from the root: at an accepted node with target distribution ``p`` (processed,
``serving.sampling.sampler``) the residual ``r`` starts as ``p``; its children are tried in
order. A drafter's proposal is deterministic, a point mass ``q`` on the child's token ``x``, so
the ratio test min(1, r(x) / q(x)) accepts ``x`` with probability r(x); on rejection the residual
becomes norm(max(r - q, 0)), ``r`` without ``x``. The first accepted child is the next node;
when none is accepted the bonus token is drawn from the last residual (``p`` without every
child's token). By induction each emitted token is distributed as ``p`` given the ones before it.

Tensor form over the [B, W] grid of ``greedy_accept`` (W the widest entry, padded cells invalid):

- child t of node a, with earlier siblings s (distinct tokens first tried): r(x_t) =
  p_a(x_t) / (1 - sum_s p_a(x_s)); a token an earlier sibling already tried has r = 0;
- t is tried with uniform ``uniforms(seed, position of a, 1 + its rank among siblings)`` and
  passes when u < r(x_t); it matches when it passes and no earlier sibling passed (the walk
  stops at the first), and is accepted when every ancestor-or-self matches (the root does);
- the deepest accepted cell's children were all tried and rejected: its residual is ``p`` with
  their tokens zeroed, and the bonus is drawn from it with draw 0 at its position (the draw
  plain sampling uses there: with no drafts this is plain sampling, token for token).

Decisions:
- Draws are counter-based per (seed, position, index) (``serving.sampling.rng``): a position's
  draws decide only the step whose walk reaches it (the next step starts one past the last
  accepted position), so steps draw independently and a replay draws what eager steps draw.
- A greedy row's ``p`` is one-hot at its argmax: a child passes iff it is the argmax and no
  earlier sibling had that token, and the bonus is the argmax, exactly ``greedy_accept``.
- A residual that rounding left without mass (every token tried, the last test failing at
  u >= r = 1 - 1e-7) falls back to ``p``.
- Fixed shapes ([B, W, W] comparisons, a [B, V] residual), no host sync: a captured step runs it.
"""

from __future__ import annotations

import torch

from serving.sampling.rng import uniforms
from serving.sampling.sampler import sample_from


def acceptance_probability(p_tok: torch.Tensor, tried_mass: torch.Tensor, repeat: torch.Tensor) -> torch.Tensor:
    """The ratio test min(1, r(x) / q(x)) of each child against a point-mass proposal: r(x), the
    residual's mass at the child's token. p_tok: float32 [B, W], p of the child's token after its
    parent; tried_mass: the mass of the distinct tokens its earlier siblings tried; repeat: bool
    [B, W], an earlier sibling tried this token (r(x) = 0)."""
    ratio = p_tok / (1 - tried_mass).clamp_min(1e-30)
    return torch.where(repeat, torch.zeros_like(ratio), ratio).clamp(max=1.0)


def residual(p_last: torch.Tensor, tried: torch.Tensor) -> torch.Tensor:
    """float32 [B, V]: where the bonus token is drawn from, ``p_last`` (float32 [B, V], p at the
    deepest accepted cell) without the tokens its children tried (``tried`` float32 [B, V] > 0);
    unnormalized (``sample_from`` needs no normalization), ``p_last`` itself when nothing is left."""
    out = p_last.masked_fill(tried > 0, 0.0)
    empty = out.sum(dim=-1) <= 0
    return torch.where(empty[:, None], p_last, out)


def sampled_accept(probs: torch.Tensor, fields: dict[str, torch.Tensor], width: int) -> dict[str, torch.Tensor]:
    """Accept each entry's drafts by speculative sampling.

    probs: float32 [N, V], the processed target distribution after each row. fields: a sampled
    step's device fields (``grid_rows``, ``grid_parents``, ``grid_depth`` int64 [B*W],
    ``grid_valid`` bool [B*W], ``grid_anc`` bool [B*W*W], ``input_ids``, ``positions``, ``seed``
    int64 [N]).
    Returns, as ``greedy_accept``: n_accepted int64 [B], order int64 [B, W] (path order), bonus
    int64 [B]; and next_ids int64 [N]: the token after each row on the accepted path (the accepted
    child's, or the bonus after the last accepted cell; the bonus on rows off the path).
    """
    v = probs.shape[-1]
    rows = fields["grid_rows"].view(-1, width)
    parents = fields["grid_parents"].view(-1, width)
    depth = fields["grid_depth"].view(-1, width)
    valid = fields["grid_valid"].view(-1, width)
    anc = fields["grid_anc"].view(-1, width, width)
    ids, positions, seeds = fields["input_ids"], fields["positions"], fields["seed"]
    tokens = ids[rows]  # [B, W]
    parent_rows = rows.gather(1, parents)
    cells = torch.arange(width, device=probs.device)
    child = (cells > 0)[None, :] & valid  # every valid cell but the root
    earlier = torch.ones(width, width, dtype=torch.bool, device=probs.device).tril(-1)
    siblings = (parents[:, :, None] == parents[:, None, :]) & earlier & child[:, :, None] & child[:, None, :]  # [B, t, s]
    repeat = (siblings & (tokens[:, :, None] == tokens[:, None, :])).any(-1)  # t's token tried before it
    p_tok = probs[parent_rows, tokens]  # [B, W]: p of each cell's token after its parent
    tried = (siblings & ~repeat[:, None, :]).to(probs.dtype)
    ratio = acceptance_probability(p_tok, (tried * p_tok[:, None, :]).sum(-1), repeat)
    u = uniforms(seeds[rows], positions[parent_rows], 1 + siblings.sum(-1))
    passed = (u < ratio) & child
    match = passed & ~(siblings & passed[:, None, :]).any(-1)
    match = torch.where(cells[None, :] == 0, valid, match)
    accepted = ~(anc & ~match[:, None, :]).any(-1) & valid
    key = torch.where(accepted, depth, torch.full_like(depth, -1))
    n_accepted = key.max(dim=1).values.clamp_min(0)
    last = key.argmax(dim=1)  # [B]: the deepest accepted cell (one path: unique)
    last_row = rows.gather(1, last[:, None]).squeeze(1)
    tried_last = (parents == last[:, None]) & child  # its children: each tried and rejected
    removed = torch.zeros(rows.shape[0], v, dtype=probs.dtype, device=probs.device)
    removed.scatter_add_(1, tokens, tried_last.to(probs.dtype))  # counts 0/1: exact in any order
    left = residual(probs.index_select(0, last_row), removed)
    bonus = sample_from(left, uniforms(seeds[last_row], positions[last_row], 0))
    order = torch.argsort(torch.where(accepted, depth, torch.full_like(depth, width)), dim=1, stable=True)
    # The token after each cell on the path: its accepted child's, else the bonus.
    on_path_child = (parents[:, None, :] == cells[None, :, None]) & (accepted & child)[:, None, :]  # [B, cell, t]
    child_token = (on_path_child * tokens[:, None, :]).sum(-1)
    after = torch.where(on_path_child.any(-1), child_token, bonus[:, None])  # [B, W]
    n = ids.shape[0]
    next_ids = torch.zeros(n + 1, dtype=ids.dtype, device=ids.device)
    next_ids.scatter_(0, torch.where(valid, rows, n).reshape(-1), after.reshape(-1))  # padded cells: the spare element
    return {"n_accepted": n_accepted, "order": order, "bonus": bonus, "next_ids": next_ids[:n]}
