"""Thresholds checked against the metrics a gate reported: ``check_thresholds``.

A metric that was not reported fails (it never defaults to 0); so do ``null``, NaN, infinite,
boolean and string values, each with its own reason. A metric reported as a list of numbers
(samples) is judged on the confidence interval of its median (``runner.plan.samples``). The
same function judges ``expect`` (the verdict) and ``targets`` (shown, never judged).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from runner.formatting import format_metric
from runner.plan.samples import (
    DEFAULT_CONFIDENCE,
    MedianInterval,
    describe,
    interval_gap,
    interval_holds,
    is_samples,
    median_interval,
    sample_problem,
)
from runner.records.results import MetricCheck

if TYPE_CHECKING:
    from runner.plan.thresholds import Threshold


def check_thresholds(
    expect: Mapping[str, Threshold], metrics: Mapping[str, object], confidence: float = DEFAULT_CONFIDENCE
) -> list[MetricCheck]:
    """Check every ``expect`` (or ``targets``) entry, in order, against ``metrics``.

    A metric that was not reported fails (it never defaults to 0); so do ``null``, NaN,
    infinite, boolean and string values, each with its own reason. A metric reported as a list
    of samples is judged on the ``confidence`` interval of its median (``_check_samples``).
    """
    checks = []
    for metric, threshold in expect.items():
        text = str(threshold)
        if metric not in metrics:
            checks.append(
                MetricCheck(metric=metric, threshold=text, value=None, ok=False,
                            reason="not reported")
            )
            continue
        value = metrics[metric]
        if is_samples(value):
            checks.append(_check_samples(metric, threshold, value, confidence))
            continue
        problem = _not_a_number(value)
        if problem is None:
            ok = bool(threshold.check(value))
            shown = _shown(value, threshold, ok)
            reason = f"{shown} {text}" if ok else f"{shown} is not {text}"
        else:
            ok, reason = False, problem
        checks.append(
            MetricCheck(metric=metric, threshold=text, value=_as_metric_value(value), ok=ok,
                        reason=reason, gap=threshold.gap(value))
        )
    return checks


def _check_samples(metric: str, threshold: Threshold, samples: list, confidence: float) -> MetricCheck:
    """The check of a sampled metric: the threshold must hold over the whole interval of the
    median (``runner.plan.samples``)."""
    text = str(threshold)
    problem = sample_problem(samples)
    if problem is not None:
        return MetricCheck(metric=metric, threshold=text, value=None, ok=False, reason=problem,
                           samples=len(samples), confidence=confidence)
    return check_interval(metric, threshold, median_interval(samples, confidence))


def check_interval(metric: str, threshold: Threshold, interval: MedianInterval) -> MetricCheck:
    """The check of a sampled metric from its median's interval (``_check_samples``; a checkpoint's
    open target, which keeps the interval and not the samples): the threshold must hold over all
    of it."""
    text = str(threshold)
    confidence = interval.confidence
    ok = interval_holds(threshold.op, threshold.value, interval)
    shown = describe(interval)
    if interval.bounded:  # rounded bounds that would read as the opposite verdict: every digit
        rounded = replace(interval, low=float(format(interval.low, ".4g")), high=float(format(interval.high, ".4g")))
        if interval_holds(threshold.op, threshold.value, rounded) != ok:
            shown = describe(interval, digits=None)
    if not interval.bounded:
        reason = f"{shown}; {text} is judged on the interval"
    else:
        reason = f"{shown} {text}" if ok else f"{shown}: not {text} over the interval"
    return MetricCheck(
        metric=metric, threshold=text, value=interval.median, ok=ok, reason=reason,
        gap=interval_gap(threshold.op, threshold.value, interval), samples=interval.n,
        interval=[interval.low, interval.high] if interval.bounded else None, confidence=confidence,
    )


def _shown(value: float, threshold: Threshold, ok: bool) -> str:
    """``value`` to four significant digits, unless the rounded text would read as the
    opposite verdict (0.99996 is not ``>= 1``, yet rounds to 1): then every digit."""
    text = format_metric(float(value))
    return text if threshold.check(float(text)) == ok else repr(value)


def _not_a_number(value: object) -> str | None:
    """Why ``value`` cannot be compared with a threshold, or ``None`` when it can."""
    if value is None:
        return "reported as null"
    if isinstance(value, bool):
        return f"is a boolean ({value}), not a number"
    if isinstance(value, str):
        return f"is a string ({value!r}), not a number"
    if not isinstance(value, (int, float)):
        return f"is a {type(value).__name__}, not a number"
    if math.isnan(value):
        return "is NaN"
    if math.isinf(value):
        return "is infinite"
    return None


def _as_metric_value(value: object) -> bool | int | float | str | None:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)
