"""Comparing the metrics of two runs, like ``dvc metrics diff``. Pure.

Every metric the two runs report for the same (phase, gate, metric) gets old, new, delta and
delta % (a metric reported as samples by its median, shown with its interval). Whether a change
is worse comes from the plan: a metric whose ``expect`` threshold is ``>=``/``>`` is better
higher, ``<=``/``<`` better lower; other metrics only show their delta. A worse change is a
**regression** only when it is significant (a rank test, for samples), larger than the gate's
declared ``tolerance`` for that metric (10% where it declares none) *and* both runs have the same machine fingerprint
(``runner.views.significance`` says how each verdict is reached); on different machines a
directional change is "not comparable", never a regression. A metric one run lacks because its
gate did not run there (``BLOCKED``, ``SKIPPED``, or not in the file) is "not run", not
"added" or "removed".

``MetricDelta.notable`` is what ``runner diff`` shows by default: metrics with a threshold, and
changes beyond ``NOISE_PCT`` (or of a value that is not a number).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from pathlib import Path

from runner.errors import UsageError
from runner.plan.samples import DEFAULT_CONFIDENCE, MedianInterval, representative
from runner.plan.schema import Gate, Plan
from runner.plan.thresholds import Threshold
from runner.records.checks import check_thresholds
from runner.views.runs import RunRecord, describe_machine, display_path
from runner.views.significance import Direction, Verdict, judge

NOISE_PCT = 1.0  # a change of a metric without a threshold smaller than this (%) is not shown by default

_DIRECTIONS: dict[str, Direction] = {">=": "higher", ">": "higher", "<=": "lower", "<": "lower"}


@dataclass(frozen=True)
class MetricDelta:
    """One metric in both runs. ``old``/``new`` are the values, a list of samples as its median;
    ``delta``/``delta_pct`` are ``None`` when not numeric (or ``delta_pct`` when the old value
    is 0); ``tolerance`` is relative (0.05 = 5%): the gate's, or for a directional change judged
    without one ``DEFAULT_TOLERANCE`` with ``tolerance_default`` set. ``target`` is the metric's target in the plan,
    with ``target_met`` and ``target_gap`` for the new value (a target never makes a
    regression). For a side reported as samples, ``old_samples``/``new_samples`` count them and
    ``old_interval``/``new_interval`` are the ``[low, high]`` interval of the median at
    ``confidence`` (``None`` when too few); ``p_value`` is the rank test's, when one ran."""

    phase: str
    gate: str
    metric: str
    old: object
    new: object
    delta: float | None
    delta_pct: float | None
    threshold: str | None
    tolerance: float | None
    verdict: Verdict
    target: str | None = None
    target_met: bool | None = None
    target_gap: float | None = None
    p_value: float | None = None
    confidence: float | None = None
    old_samples: int | None = None
    new_samples: int | None = None
    old_interval: list[float] | None = None
    new_interval: list[float] | None = None
    tolerance_default: bool = False

    @property
    def notable(self) -> bool:
        """Shown without ``--all``: a metric with a threshold or a target, or a real change of
        one both runs report; never a metric whose gate did not run in one of them."""
        if self.verdict == "not run":
            return False
        if self.threshold is not None or self.target is not None:
            return True
        if self.verdict in ("added", "removed"):
            return False
        if self.verdict in ("unchanged", "no significant change"):
            return False
        if self.verdict == "changed" and self.delta is not None:
            return self.delta_pct is None or abs(self.delta_pct) >= NOISE_PCT
        return True


@dataclass(frozen=True)
class DiffSide:
    label: str
    run_id: str
    time: str
    machine: str
    machine_fingerprint: str
    path: str
    role: str = "run"
    reason: str = ""

    @property
    def title(self) -> str:
        """``20261130T…-a7576174 (2026-11-30T00:15:25Z, vm: NVIDIA H200)``, with ``evidence``."""
        return f"{self.run_id} ({self.detail})"

    @property
    def detail(self) -> str:
        """``2026-11-30T00:15:25Z, vm: NVIDIA H200`` (and ``evidence``): the run beside its id."""
        extra = ""
        if self.role == "evidence":
            extra = f"; evidence{', ' + self.reason if self.reason else ''}"
        return f"{self.time}, {self.machine}{extra}"


@dataclass(frozen=True)
class MetricsDiff:
    old: DiffSide
    new: DiffSide
    comparable: bool
    rows: list[MetricDelta]

    @property
    def regressions(self) -> list[MetricDelta]:
        return [row for row in self.rows if row.verdict == "regression"]

    @property
    def judged_by_default(self) -> list[MetricDelta]:
        """Changes for the worse judged against ``DEFAULT_TOLERANCE``: the plan declares none."""
        return [row for row in self.rows if row.tolerance_default and row.verdict in ("regression", "within tolerance")]

    @property
    def note(self) -> str:
        if self.comparable:
            return "same machine fingerprint: regressions are judged against the plan's tolerances"
        return (
            "different machine fingerprints: timings are not comparable, so no change is "
            "judged a regression"
        )

    def to_json(self) -> dict:
        return {
            "old": asdict(self.old),
            "new": asdict(self.new),
            "comparable": self.comparable,
            "note": self.note,
            "regressions": len(self.regressions),
            "metrics": [_json_row(row) for row in self.rows],
        }


def diff_runs(plan: Plan, old: RunRecord, new: RunRecord, *, labels: tuple[str, str] = ("A", "B"),
              root: Path | None = None) -> MetricsDiff:
    """Compare every metric of the phases both runs hold."""
    shared = {p.phase for p in old.phase_results()} & {p.phase for p in new.phase_results()}
    if not shared:
        raise UsageError(
            f"the runs share no phase ({labels[0]}: {', '.join(p.phase for p in old.phase_results())}; "
            f"{labels[1]}: {', '.join(p.phase for p in new.phase_results())})"
        )
    comparable = old.machine.fingerprint == new.machine.fingerprint
    old_metrics = {key: value for key, value in old.metrics().items() if key[0] in shared}
    new_metrics = {key: value for key, value in new.metrics().items() if key[0] in shared}
    keys = list(old_metrics) + [key for key in new_metrics if key not in old_metrics]
    ran_old, ran_new = _gates_that_ran(old), _gates_that_ran(new)
    rows = []
    for key in keys:
        phase, gate_name, metric = key
        old_value = old_metrics.get(key, _MISSING)
        new_value = new_metrics.get(key, _MISSING)
        not_run = (old_value is _MISSING and (phase, gate_name) not in ran_old) or (
            new_value is _MISSING and (phase, gate_name) not in ran_new)
        spec = _gate_spec(plan, phase, gate_name)
        threshold = spec.expect.get(metric) if spec is not None else None
        target = spec.targets.get(metric) if spec is not None else None
        tolerance = spec.tolerance.get(metric) if spec is not None else None
        steer = threshold or target  # which way is better: the threshold's, else the target's
        rows.append(
            compare_metric(
                phase, gate_name, metric,
                old_value, new_value,
                threshold=str(threshold) if threshold is not None else None,
                direction=_DIRECTIONS.get(steer.op) if steer is not None else None,
                tolerance=tolerance,
                comparable=comparable,
                not_run=not_run,
                target=target,
                confidence=spec.confidence if spec is not None else DEFAULT_CONFIDENCE,
            )
        )
    return MetricsDiff(
        old=_side(labels[0], old, root), new=_side(labels[1], new, root), comparable=comparable, rows=rows
    )


class _Missing:
    def __repr__(self) -> str:
        return "-"


_MISSING = _Missing()


def compare_metric(
    phase: str, gate: str, metric: str, old: object, new: object, *,
    threshold: str | None, direction: Direction | None, tolerance: float | None, comparable: bool,
    not_run: bool = False, target: Threshold | None = None, confidence: float = DEFAULT_CONFIDENCE,
) -> MetricDelta:
    """One row of the diff; ``old``/``new`` are the values as reported (a list of samples, a
    number, ...) or ``_MISSING`` when a run did not report it (``not_run``: because the gate did
    not run in that run); ``target`` is judged on ``new``, samples at ``confidence``."""
    judgement = None
    if not_run:
        verdict: Verdict = "not run"
    elif old is _MISSING:
        verdict = "added"
    elif new is _MISSING:
        verdict = "removed"
    else:
        judgement = judge(old, new, direction=direction, tolerance=tolerance, comparable=comparable,
                          confidence=confidence)
        verdict = judgement.verdict
    old_value = _MISSING if old is _MISSING else representative(old)
    new_value = _MISSING if new is _MISSING else representative(new)
    delta = delta_pct = None
    if _is_number(old_value) and _is_number(new_value):
        delta = float(new_value) - float(old_value)
        delta_pct = 100.0 * delta / abs(float(old_value)) if old_value != 0 else None
    target_check = None
    if target is not None and new is not _MISSING:
        [target_check] = check_thresholds({metric: target}, {metric: new}, confidence)
    sampled = isinstance(old, list) or isinstance(new, list)
    return MetricDelta(
        phase=phase, gate=gate, metric=metric,
        old=None if old_value is _MISSING else old_value, new=None if new_value is _MISSING else new_value,
        delta=delta, delta_pct=delta_pct, threshold=threshold, verdict=verdict,
        tolerance=judgement.tolerance if judgement is not None and judgement.tolerance is not None else tolerance,
        tolerance_default=judgement is not None and judgement.default_tolerance,
        target=str(target) if target is not None else None,
        target_met=target_check.ok if target_check is not None else None,
        target_gap=target_check.gap if target_check is not None else None,
        p_value=judgement.p_value if judgement is not None else None,
        confidence=confidence if sampled else None,
        old_samples=len(old) if isinstance(old, list) else None,
        new_samples=len(new) if isinstance(new, list) else None,
        old_interval=_bounds(judgement.old_interval) if judgement is not None else None,
        new_interval=_bounds(judgement.new_interval) if judgement is not None else None,
    )


def _bounds(interval: MedianInterval | None) -> list[float] | None:
    return [interval.low, interval.high] if interval is not None and interval.bounded else None


def _gates_that_ran(run: RunRecord) -> set[tuple[str, str]]:
    return {
        (phase.phase, gate.name)
        for phase in run.phase_results()
        for gate in phase.gates
        if gate.outcome not in ("BLOCKED", "SKIPPED")
    }


def _is_number(value: object) -> bool:
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def _gate_spec(plan: Plan, phase_id: str, gate_name: str) -> Gate | None:
    try:
        return plan.phase(phase_id).gate(gate_name)
    except UsageError:
        return None


def _side(label: str, run: RunRecord, root: Path | None) -> DiffSide:
    return DiffSide(
        label=label, run_id=run.run_id, time=run.results.created, machine=describe_machine(run.machine),
        machine_fingerprint=run.machine.fingerprint, path=display_path(run.path, root),
        role=run.meta.role, reason=run.meta.reason,
    )


def _json_row(row: MetricDelta) -> dict:
    """One row for ``--json`` (non-finite values are made JSON by ``formatting.json_text``)."""
    data = asdict(row)
    data["notable"] = row.notable
    return data
