"""What a step computes after the logits, on the device and without a host sync, so a CUDA
graph can hold it: each row's greedy token, its top-two margin, the drafter's top-k, and the
greedy acceptance of a draft tree with the accepted slots written to the slot table.

Acceptance is ``tree.accept_greedy`` (the host oracle) in tensor form over a [B, W] grid of
each entry's tokens (W the widest entry; padded cells invalid):

- cell t matches when its token is the target's choice after its parent, and no earlier
  sibling matched (``accept_greedy`` walks children in order);
- t is accepted when every ancestor-or-self matches (the root always does);
- the accepted cells form one path; in depth order they are the entry's new slots to keep,
  the drafts' tokens to emit, and the deepest one's choice is the bonus token.

Decisions:
- Every shape is fixed by the grid, so eager and captured steps run the same ops.
- The table write covers W cells per entry: accepted ones at ``prefix_len + i``, the rest
  sent to element 0 of the padding row with value 0 (duplicates write equal values).
"""

from __future__ import annotations

import torch

BF16_MANTISSA_BITS = 7


def bf16_resolution(x: torch.Tensor) -> torch.Tensor:
    """One bf16 ulp at |x| (the spacing of bf16 numbers there): 2^(floor(log2|x|) - 7)."""
    return torch.exp2(torch.floor(torch.log2(x.abs().clamp_min(1e-30))) - BF16_MANTISSA_BITS)


def row_outputs(logits: torch.Tensor, topk: int) -> dict[str, torch.Tensor]:
    """pred int64 [N] (first maximum, as ``argmax``), gap fp32 [N] (top-1 minus top-2 logit),
    near_tie bool [N] (gap at most one bf16 ulp of the top logit), and with ``topk`` the top-k ids
    int64 [N, topk].

    At most, not under: bf16 logits are bf16 numbers, so two apart by less than an ulp before
    rounding come out equal or adjacent (one ulp apart); "under one ulp" would be ties alone.
    """
    out = {"pred": logits.argmax(dim=-1)}
    if logits.shape[-1] >= 2:
        top = logits.topk(2, dim=-1).values
        out["gap"] = top[:, 0] - top[:, 1]
        out["near_tie"] = out["gap"] <= bf16_resolution(top[:, 0])
    if topk:
        out["topk"] = logits.topk(topk, dim=-1).indices
    return out


def greedy_accept(pred: torch.Tensor, fields: dict[str, torch.Tensor], width: int) -> dict[str, torch.Tensor]:
    """Accept each entry's drafts greedily.

    pred: int64 [N], the target's token after each row. fields: a step's device fields
    (``grid_rows``, ``grid_parents``, ``grid_depth`` int64 [B*W], ``grid_valid`` bool [B*W],
    ``grid_anc`` bool [B*W*W], ``input_ids`` int64 [N]).
    Returns n_accepted int64 [B] (drafts accepted), order int64 [B, W] (cells in path order,
    the first n_accepted + 1 accepted: the root, then each accepted draft), bonus int64 [B].
    """
    rows = fields["grid_rows"].view(-1, width)
    parents = fields["grid_parents"].view(-1, width)
    depth = fields["grid_depth"].view(-1, width)
    valid = fields["grid_valid"].view(-1, width)
    anc = fields["grid_anc"].view(-1, width, width)
    choice = pred[rows]  # [B, W]: the target's token after each cell
    match = (fields["input_ids"][rows] == choice.gather(1, parents)) & valid
    root = torch.zeros_like(match)
    root[:, 0] = True
    match = torch.where(root, valid, match)
    earlier = torch.ones(width, width, dtype=torch.bool, device=pred.device).tril(-1)
    earlier[:, 0] = False  # the root is nobody's sibling
    siblings = (parents[:, :, None] == parents[:, None, :]) & earlier
    match = match & ~(siblings & match[:, None, :]).any(-1)
    accepted = ~(anc & ~match[:, None, :]).any(-1) & valid
    key = torch.where(accepted, depth, torch.full_like(depth, -1))
    n_accepted = key.max(dim=1).values.clamp_min(0)
    bonus = choice.gather(1, key.argmax(dim=1, keepdim=True)).squeeze(1)
    order = torch.argsort(torch.where(accepted, depth, torch.full_like(depth, width)), dim=1, stable=True)
    return {"n_accepted": n_accepted, "order": order, "bonus": bonus}


def write_accepted_slots(table: torch.Tensor, fields: dict[str, torch.Tensor], order: torch.Tensor,
                         n_accepted: torch.Tensor, width: int) -> None:
    """Write each real entry's accepted slots (path order) into its slot-table row at
    ``prefix_len ..``. table: int32 [R, max_context]; order, n_accepted: from ``greedy_accept``."""
    rows = fields["grid_rows"].view(-1, width)
    valid = fields["grid_valid"].view(-1, width)
    slots = fields["out_slots"][rows].gather(1, order)  # [B, W] new slots in path order
    steps = torch.arange(width, device=order.device)
    keep = (steps[None, :] <= n_accepted[:, None]) & valid[:, :1]
    target = fields["rows"][:, None] * table.stride(0) + fields["prefix_lens"][:, None] + steps[None, :]
    flat = table.view(-1)
    flat.index_put_((torch.where(keep, target, 0).reshape(-1),),
                    torch.where(keep, slots, 0).to(table.dtype).reshape(-1))
