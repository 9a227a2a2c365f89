"""Thresholds on sampled metrics: a confidence interval of the median from order statistics.

A gate may report a metric as a list of numbers (its samples), or run ``repeat: N`` times and
have each run's number collected into one. A threshold on such a metric is judged on the
distribution-free interval ``[x(k), x(n+1-k)]`` of the sorted samples around their median, with
the largest ``k`` whose coverage ``1 - 2 P(B <= k-1)``, ``B ~ Binomial(n, 1/2)``, is at least the
gate's ``confidence`` (default 0.95). The threshold must hold over the whole interval: ``>= x``
passes only when the lower bound is ``>= x``, ``<= x`` only when the upper bound is ``<= x``
(``>`` and ``<`` alike), ``== x`` only when both bounds are ``x``, ``!= x`` only when ``x`` lies
outside the interval. A single number is judged as before.

Decisions:

- Order statistics, not a normal approximation: benchmark timings are skewed and heavy-tailed,
  and the interval needs no assumption about their shape. The coverage is computed exactly with
  integers (``MAX_SAMPLES`` bounds the cost).
- Too few samples for the confidence (fewer than 6 at 0.95: even ``[min, max]`` covers only
  ``1 - 2/2^n``) give no interval: every threshold on the metric fails, saying how many samples
  the confidence needs. Nothing is passed on too little evidence.
- A sample that is not a finite number (NaN, infinity, a boolean, a string) fails the check;
  it is never dropped to make the rest pass.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from runner.formatting import format_metric

DEFAULT_CONFIDENCE = 0.95
MAX_SAMPLES = 10_000
"""The most samples one metric may hold (a gate's metrics file is at most 1 MiB anyway)."""


@dataclass(frozen=True)
class MedianInterval:
    """The median of ``n`` samples and its interval at ``confidence`` (``low``/``high`` are
    ``-inf``/``inf`` when ``n`` is too small for any interval at that confidence)."""

    n: int
    median: float
    low: float
    high: float
    confidence: float

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)


def is_samples(value: Any) -> bool:
    """Whether a metric value is a list of samples (rather than a single value)."""
    return isinstance(value, list)


def sample_problem(value: list[Any]) -> str | None:
    """Why the samples in ``value`` cannot be judged, or ``None`` when they can."""
    if not value:
        return "is an empty list of samples"
    if len(value) > MAX_SAMPLES:
        return f"holds {len(value)} samples, more than the {MAX_SAMPLES} a metric may hold"
    for index, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            return f"sample {index} is {type(item).__name__} {item!r:.40}, not a number"
        if not math.isfinite(item):
            return f"sample {index} is {item}, not a finite number"
    return None


def min_samples(confidence: float) -> int:
    """The fewest samples whose ``[min, max]`` covers the median with ``confidence``."""
    n = 1
    while 1 - 2 * Fraction(1, 2**n) < Fraction(confidence):
        n += 1
    return n


def median_interval(samples: list[float], confidence: float = DEFAULT_CONFIDENCE) -> MedianInterval:
    """The median of ``samples`` (finite numbers, see ``sample_problem``) and its interval."""
    ordered = sorted(float(item) for item in samples)
    n = len(ordered)
    rank = _rank(n, Fraction(confidence))
    median = statistics.median(ordered)
    if rank == 0:
        return MedianInterval(n, median, -math.inf, math.inf, confidence)
    return MedianInterval(n, median, ordered[rank - 1], ordered[n - rank], confidence)


def _rank(n: int, confidence: Fraction) -> int:
    """The largest ``k`` (1-based, ``k <= (n + 1) / 2``) with ``1 - 2 P(B <= k-1) >= confidence``
    for ``B ~ Binomial(n, 1/2)``; 0 when even ``k = 1`` falls short."""
    total = 2**n
    allowed = (1 - confidence) * total / 2  # P(B <= k-1) * 2^n may be at most this
    below = 0  # sum of C(n, i) for i < k
    term = 1  # C(n, k-1)
    best = 0
    for k in range(1, (n + 1) // 2 + 1):
        below += term  # now the sum over i <= k-1
        if below > allowed:
            break
        best = k
        term = term * (n - (k - 1)) // k
    return best


def interval_holds(op: str, bound: float, interval: MedianInterval) -> bool:
    """Whether the comparison ``value <op> bound`` holds for every value in the interval."""
    if not interval.bounded:
        return False
    low, high = interval.low, interval.high
    return {
        ">=": low >= bound,
        ">": low > bound,
        "<=": high <= bound,
        "<": high < bound,
        "==": low == bound == high,
        "!=": bound < low or bound > high,
    }[op]


def interval_gap(op: str, bound: float, interval: MedianInterval) -> float | None:
    """How far the interval is from meeting ``<op> bound``: 0 when it does, the distance from
    the bound that decides (the lower one for ``>=``, the upper for ``<=``) when it does not,
    ``None`` when no distance says it (no interval, a missed ``!=``)."""
    if not interval.bounded:
        return None
    if interval_holds(op, bound, interval):
        return 0.0
    if op in (">=", ">"):
        return bound - interval.low
    if op in ("<=", "<"):
        return interval.high - bound
    if op == "==":
        return max(abs(interval.low - bound), abs(interval.high - bound))
    return None


def describe(interval: MedianInterval, digits: int | None = 4) -> str:
    """``median 2.31, 95% interval [2.1, 2.5] of 20 samples``; ``digits=None``: every digit."""
    def number(value: float) -> str:
        return repr(float(value)) if digits is None else format(value, f".{digits}g")

    level = f"{interval.confidence * 100:g}%"
    if not interval.bounded:
        return (f"median {number(interval.median)} of {interval.n} sample{'s' if interval.n != 1 else ''}: "
                f"too few for a {level} interval (at least {min_samples(interval.confidence)})")
    return (f"median {number(interval.median)}, {level} interval [{number(interval.low)}, "
            f"{number(interval.high)}] of {interval.n} samples")


def metric_text(value: Any, confidence: float = DEFAULT_CONFIDENCE) -> str:
    """A metric as the views show it: ``format_metric`` for one value; for samples their median
    and its interval, ``2.31 (median of 20; 95% interval [2.1, 2.5])``, or ``2.31 (median of 3;
    too few for a 95% interval)``."""
    if not is_samples(value) or sample_problem(value) is not None:
        return format_metric(value)
    interval = median_interval(value, confidence)
    level = f"{confidence * 100:g}%"
    where = (f"{level} interval [{format_metric(interval.low)}, {format_metric(interval.high)}]" if interval.bounded
             else f"too few for a {level} interval")
    return f"{format_metric(float(interval.median))} (median of {interval.n}; {where})"


def merge_repetitions(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The metrics of a gate run ``repeat`` times: each metric reported as a number (or a list
    of samples) by any repetition becomes the list of all its samples, in order; any other
    value (a string, a boolean, null) is the last repetition's."""
    merged: dict[str, Any] = {}
    for metrics in runs:
        for name, value in metrics.items():
            numeric = isinstance(value, list) or (isinstance(value, (int, float)) and not isinstance(value, bool))
            if numeric:
                samples = merged.get(name) if isinstance(merged.get(name), list) else []
                merged[name] = samples + (list(value) if isinstance(value, list) else [value])
            else:
                merged[name] = value
    return merged


def representative(value: Any) -> Any:
    """A metric as one value: a list of samples as its median (``None`` when the samples
    cannot be judged, see ``sample_problem``), anything else as it is."""
    if not is_samples(value):
        return value
    return None if sample_problem(value) is not None else statistics.median(value)
