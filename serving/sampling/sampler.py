"""Sampling on the device: the processed distribution after each row's logits, and a token
drawn from it by inverse CDF with the row's counter-based uniform. No host sync, fixed shapes:
a captured step runs it as eager steps do.

Decisions:
- Processing in float32 (logits of any dtype), per row with the row's own parameters, in
  transformers' order (``serving.sampling.params``): temperature, top-k, top-p, min-p. One
  descending sort serves top-k and top-p; the kept set is scattered back to vocabulary order.
- Greedy rows (temperature 0) get a one-hot distribution at ``argmax`` (the first maximum, as
  greedy decoding picks): drawing from it, and accepting drafts against it
  (``serving.speculation.rejection``), gives the greedy tokens exactly, so a batch may mix
  greedy and sampled requests in one step.
- Inverse CDF: the first token whose float32 cumulative mass exceeds ``u`` times the total,
  clamped to the last token of non-zero mass (``u`` times the total may round up to the total).
- Logits over a tiny temperature are clamped to float32's finite range, so a temperature of
  1e-30 is a sharp softmax rather than NaN.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from serving.sampling.params import GREEDY, SamplingParams
from serving.sampling.rng import uniforms

FLOAT32_MAX = torch.finfo(torch.float32).max


def processed_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                    min_p: torch.Tensor) -> torch.Tensor:
    """float32 [N, V]: each row's sampling distribution.

    logits: [N, V] any float dtype. temperature, top_p, min_p: float32 [N]; top_k: int64 [N]
    (the row's request's parameters; 0 temperature: greedy, a one-hot row).
    """
    v = logits.shape[-1]
    greedy = temperature <= 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature)
    x = (logits.float() / scale[:, None]).clamp(-FLOAT32_MAX, FLOAT32_MAX)
    ordered, order = x.sort(dim=-1, descending=True)  # [N, V]
    k = torch.where((top_k > 0) & (top_k < v), top_k, torch.full_like(top_k, v))
    kth = ordered.gather(1, (k - 1)[:, None])
    keep = ordered >= kth  # top-k: ties with the k-th stay
    probs = ordered.masked_fill(~keep, float("-inf")).softmax(dim=-1)
    tail = probs.flip(-1).cumsum(-1).flip(-1)  # mass of this token and every less likely one
    drop = tail <= (1 - top_p)[:, None]
    drop[:, 0] = False  # the most likely token always stays
    keep &= ~drop
    probs = ordered.masked_fill(~keep, float("-inf")).softmax(dim=-1)
    keep &= ~(probs < min_p[:, None] * probs[:, :1])
    kept = torch.zeros_like(keep).scatter_(1, order, keep)
    out = x.masked_fill(~kept, float("-inf")).softmax(dim=-1)
    one_hot = torch.zeros_like(out).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
    return torch.where(greedy[:, None], one_hot, out)


def sample_from(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """int64 [M]: a token of each row of ``probs`` (float32 [M, V], non-negative, some mass per
    row; need not sum to 1) by inverse CDF at ``u`` (float32 [M] in [0, 1))."""
    cdf = probs.cumsum(dim=-1)
    target = u * cdf[:, -1]
    index = (cdf <= target[:, None]).sum(dim=-1)
    ids = torch.arange(probs.shape[-1], device=probs.device)
    last = torch.where(probs > 0, ids, torch.zeros_like(ids)).amax(dim=-1)
    return torch.minimum(index, last)


def columns(params: Sequence[SamplingParams | None], device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """The per-row tensors ``sample_rows`` takes for rows of these requests (None: greedy):
    temperature, top_p, min_p float32 [M], top_k, seed int64 [M]. ValueError for a sampled
    request without a seed (the engine gives each one when it admits it)."""
    params = [p if p is not None and p.samples else GREEDY for p in params]
    if any(p.seed is None and p.samples for p in params):
        raise ValueError("Expected a seed for every sampled request (the engine draws one per request), got none")
    floats = {k: torch.tensor([getattr(p, k) for p in params], dtype=torch.float32) for k in ("temperature", "top_p", "min_p")}
    ints = {"top_k": torch.tensor([p.top_k for p in params], dtype=torch.int64),
            "seed": torch.tensor([p.seed or 0 for p in params], dtype=torch.int64)}
    return {k: v.to(device) for k, v in (floats | ints).items()}


def sample_rows(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                min_p: torch.Tensor, seed: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """int64 [N]: plain sampling of the token after each row (draw 0 at the row's ``position``;
    int64 [N], as ``seed``); the argmax for greedy rows."""
    probs = processed_probs(logits, temperature, top_k, top_p, min_p)
    return sample_from(probs, uniforms(seed, position, 0))
