"""Pearson's chi-square goodness-of-fit test for the sampling tests, and a reference of the
processed distribution built from transformers' own logits warpers in float64.

Decisions:
- Cells expected to hold fewer than ``MIN_EXPECTED`` draws are pooled into one cell (dropped
  when even the pool is under it), as the chi-square approximation asks; a draw in a cell of
  probability 0 is a failure by itself (``impossible`` counts them).
- The p-value is the regularized upper incomplete gamma Q(df / 2, x / 2) (torch's ``gammaincc``,
  float64): no scipy needed.
- ``ALPHA`` (1e-3) is every statistical test's false-alarm rate. The tests draw with fixed
  seeds, so a run that passes passes every time; a change that moves the distributions gets a
  fresh draw, which rejects a correct sampler with probability ALPHA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ALPHA = 1e-3
MIN_EXPECTED = 5.0


@dataclass
class ChiSquare:
    statistic: float
    df: int
    p_value: float
    impossible: int  # draws in cells of probability 0

    @property
    def rejects(self) -> bool:
        """Whether the draws are rejected at ``ALPHA`` (or hit an impossible cell)."""
        return self.impossible > 0 or self.p_value < ALPHA


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> ChiSquare:
    """Goodness of fit of ``counts`` (any integer tensor, one count per cell) to ``probs`` (the
    same shape, float64, summing to 1)."""
    counts, probs = counts.reshape(-1).double(), probs.reshape(-1).double()
    n = counts.sum()
    impossible = int(counts[probs <= 0].sum())
    expected = n * probs
    big = expected >= MIN_EXPECTED
    obs = [counts[big]]
    exp = [expected[big]]
    small = (~big) & (probs > 0)
    if expected[small].sum() >= MIN_EXPECTED:
        obs.append(counts[small].sum()[None])
        exp.append(expected[small].sum()[None])
    obs, exp = torch.cat(obs), torch.cat(exp)
    statistic = float(((obs - exp) ** 2 / exp).sum())
    df = len(obs) - 1
    p = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(statistic / 2, dtype=torch.float64)))
    return ChiSquare(statistic, df, p, impossible)


def reference_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
                    min_p: float = 0.0) -> torch.Tensor:
    """float64 [N, V]: transformers' sampling distribution of ``logits`` [N, V]: its temperature,
    top-k, top-p and min-p warpers in its own order, then the softmax (greedy: one-hot argmax)."""
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    scores = logits.double()
    if temperature == 0:
        return torch.nn.functional.one_hot(scores.argmax(-1), scores.shape[-1]).double()
    ids = torch.zeros(scores.shape[0], 1, dtype=torch.long)
    warpers = [TemperatureLogitsWarper(temperature)] + ([TopKLogitsWarper(top_k)] if top_k else []) \
        + ([TopPLogitsWarper(top_p)] if top_p < 1 else []) + ([MinPLogitsWarper(min_p)] if min_p else [])
    for warp in warpers:
        scores = warp(ids, scores)
    return scores.softmax(-1)
