"""Whether a metric got worse than its baseline: the verdict of one row of ``runner diff``.

A change for the worse is a **regression** only when two things hold:

- the change is **significant**: for a metric reported as samples (on either side), the
  two-sided Mann-Whitney U test (``runner.plan.ranktest``) of new against old gives a p-value
  below ``1 - confidence`` of the gate (0.05 by default), as asv's ``compare`` does;
- the **effect** is larger than the gate's ``tolerance`` for the metric: the relative change of
  the median (of the single value), ``|new - old| / |old|``.

Decisions:

- A sampled change that the rank test cannot tell from noise is ``no significant change``,
  whichever way its median moved and however far; the report shows both medians with their
  intervals, so a reader sees how wide the noise was.
- A significant change for the worse within the tolerance is ``within tolerance``. A metric
  with a direction (a threshold or a target) and no ``tolerance:`` is judged against
  ``DEFAULT_TOLERANCE`` (10%, asv's default factor of 1.1), and the judgement says so
  (``default_tolerance``): a 95% slowdown is a regression without any configuration, and a
  reader sees which limit judged it.
- Two single numbers carry no estimate of their noise, so they keep the plain meaning: the
  effect alone decides (``regression`` beyond the tolerance). A single number against samples
  is one sample: the rank test runs on what there is, and one number rarely proves a change.
- Medians that are equal are ``unchanged`` even when the ranks differ: the direction of a
  change is the direction of its median.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Literal

from runner.plan.ranktest import mann_whitney
from runner.plan.samples import DEFAULT_CONFIDENCE, MedianInterval, is_samples, median_interval, sample_problem
from runner.plan.schema import DEFAULT_TOLERANCE

Direction = Literal["higher", "lower"]
Verdict = Literal[
    "regression", "within tolerance", "better", "unchanged", "changed", "no significant change",
    "added", "removed", "not comparable", "not run",
]


@dataclass(frozen=True)
class Judgement:
    """The verdict on two values of one metric; ``p_value`` when a rank test ran,
    ``old_interval``/``new_interval`` for a side reported as samples; ``tolerance`` the one a
    directional change was judged with, ``default_tolerance`` when that is ``DEFAULT_TOLERANCE``
    because the plan declares none."""

    verdict: Verdict
    p_value: float | None = None
    old_interval: MedianInterval | None = None
    new_interval: MedianInterval | None = None
    tolerance: float | None = None
    default_tolerance: bool = False


def judge(old: object, new: object, *, direction: Direction | None, tolerance: float | None,
          comparable: bool, confidence: float = DEFAULT_CONFIDENCE) -> Judgement:
    """The verdict on ``new`` against ``old`` (each a number, a list of samples, or another
    value; both present: ``added``, ``removed`` and ``not run`` are the caller's); a
    ``tolerance`` of ``None`` is ``DEFAULT_TOLERANCE`` for a metric with a ``direction``."""
    old_interval, new_interval = _interval(old, confidence), _interval(new, confidence)
    old_value = old_interval.median if old_interval else old
    new_value = new_interval.median if new_interval else new
    if not (_is_number(old_value) and _is_number(new_value)):
        return Judgement("unchanged" if old == new else "changed", None, old_interval, new_interval)
    sampled = old_interval is not None or new_interval is not None
    p_value = mann_whitney(_samples(old), _samples(new)).p_value if sampled else None

    default = direction is not None and tolerance is None
    if default:
        tolerance = DEFAULT_TOLERANCE

    def verdict(name: Verdict) -> Judgement:
        return Judgement(name, p_value, old_interval, new_interval, tolerance if direction else None, default)

    delta = float(new_value) - float(old_value)
    if delta == 0:
        return verdict("unchanged")
    if direction is None:
        if p_value is not None and p_value >= 1 - confidence:
            return verdict("no significant change")
        return verdict("changed")
    if not comparable:
        return verdict("not comparable")
    if p_value is not None and p_value >= 1 - confidence:
        return verdict("no significant change")
    worse = delta < 0 if direction == "higher" else delta > 0
    if not worse:
        return verdict("better")
    relative = abs(delta) / abs(float(old_value)) if old_value != 0 else math.inf
    return verdict("regression" if relative > tolerance else "within tolerance")


def _interval(value: object, confidence: float) -> MedianInterval | None:
    if is_samples(value) and sample_problem(value) is None:
        return median_interval(value, confidence)
    return None


def _samples(value: object) -> list[float]:
    return [float(item) for item in value] if is_samples(value) else [float(value)]


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
