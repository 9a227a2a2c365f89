"""Benchmark metrics reported as samples: repetitions of one measurement inside one gate run.

A gate returns a sampled metric as a list of numbers; the runner judges a threshold on it on the
confidence interval of its median (``runner.plan.samples``: at its default confidence of 0.95,
``>= x`` passes only when that interval's lower bound is ``>= x``, and fewer than 6 samples pass
no threshold at all). Where a metric is a ratio of two configurations, their repetitions are
interleaved (``interleaved``), so a drift over the run (clocks, temperature, a neighbour on the
host) moves both sides of every sample alike instead of one side of the ratio.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")

SAMPLES = 7
"""The gates' default count: the ``[min, max]`` of 7 samples covers the median with 98% confidence
(6 is the fewest that reach the runner's default 95%)."""


def check_count(samples: int) -> int:
    """``samples`` when it is a usable count (at least 1), else ``ValueError``."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"Expected samples to be a whole number >= 1, got {samples!r}")
    return samples


def round_order(names: Sequence[str], round_index: int) -> list[str]:
    """The order to measure ``names`` in on round ``round_index``: forwards, then backwards
    (A B, B A, A B, ...), so a drift that is linear over a pair of rounds cancels out of the ratio."""
    return list(names) if round_index % 2 == 0 else list(reversed(names))


def interleaved(measures: Mapping[str, Callable[[], T]], rounds: int) -> dict[str, list[T]]:
    """Run every measurement once per round for ``rounds`` rounds (``round_order``); returns each
    one's results, one per round, in round order."""
    results: dict[str, list[T]] = {name: [] for name in measures}
    for r in range(check_count(rounds)):
        for name in round_order(list(measures), r):
            results[name].append(measures[name]())
    return results


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Per-round ratios of two interleaved measurements (a sample each)."""
    if len(numerators) != len(denominators):
        raise ValueError(f"Expected as many numerators as denominators, got {len(numerators)} and {len(denominators)}")
    return [n / d for n, d in zip(numerators, denominators)]


def median(value: float | Sequence[float]) -> float:
    """A sampled metric's median (a single number is its own)."""
    return statistics.median(value) if isinstance(value, (list, tuple)) else value


def median_index(values: Sequence[float]) -> int:
    """The index of the (lower) median value, so figures measured with it can be quoted together."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    return order[(len(order) - 1) // 2]


def table_value(value: object) -> str:
    """A metric as a report table shows it: samples as their median with the count."""
    if isinstance(value, (list, tuple)):
        return f"{statistics.median(value):.4g} (median of {len(value)})" if value else "no samples"
    if (isinstance(value, float) and math.isfinite(value)) or (isinstance(value, int) and not isinstance(value, bool)):
        return f"{value:.4g}"
    return str(value)


def rounded(value: float | Sequence[float], digits: int = 4) -> float | list[float]:
    """A metric (or each of its samples) rounded for a gate's log line."""
    return [round(v, digits) for v in value] if isinstance(value, (list, tuple)) else round(value, digits)
