"""Comparing the metrics of two runs, like ``dvc metrics diff``. Pure.

Every metric the two runs report for the same (phase, gate, metric) gets old, new, delta and
delta %. Whether a change is worse comes from the plan: a metric whose ``expect`` threshold is
``>=``/``>`` is better higher, ``<=``/``<`` better lower; other metrics only show their delta.
A worse change is a **regression** only when it is larger than the gate's declared
``tolerance`` for that metric *and* both runs have the same machine fingerprint; on different
machines a directional change is "not comparable", never a regression. A metric one run lacks
because its gate did not run there (``BLOCKED``, ``SKIPPED``, or not in the file) is "not run",
not "added" or "removed".

``MetricDelta.notable`` is what ``runner diff`` shows by default: metrics with a threshold, and
changes beyond ``NOISE_PCT`` (or of a value that is not a number).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from runner.errors import UsageError
from runner.plan.samples import representative
from runner.plan.schema import Gate, Plan
from runner.plan.thresholds import Threshold
from runner.views.runs import RunRecord, describe_machine, display_path

Direction = Literal["higher", "lower"]
Verdict = Literal[
    "regression", "within tolerance", "worse", "better", "unchanged", "changed",
    "added", "removed", "not comparable", "not run",
]
NOISE_PCT = 1.0  # a change of a metric without a threshold smaller than this (%) is not shown by default

_DIRECTIONS: dict[str, Direction] = {">=": "higher", ">": "higher", "<=": "lower", "<": "lower"}


@dataclass(frozen=True)
class MetricDelta:
    """One metric in both runs. ``delta``/``delta_pct`` are ``None`` when not numeric (or
    ``delta_pct`` when the old value is 0); ``tolerance`` is relative (0.05 = 5%). ``target``
    is the metric's target in the plan, with ``target_met`` and ``target_gap`` for the new
    value (a target never makes a regression)."""

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
        if self.verdict == "unchanged":
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
    def worse_untolerated(self) -> list[MetricDelta]:
        """Changes for the worse that no declared tolerance judges (so none is a regression)."""
        return [row for row in self.rows if row.verdict == "worse"]

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
    # a metric reported as samples is compared by its median
    old_metrics = {key: representative(value) for key, value in old.metrics().items() if key[0] in shared}
    new_metrics = {key: representative(value) for key, value in new.metrics().items() if key[0] in shared}
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
    not_run: bool = False, target: Threshold | None = None,
) -> MetricDelta:
    """One row of the diff; ``old``/``new`` are ``_MISSING`` when a run did not report it
    (``not_run``: because the gate did not run in that run); ``target`` is judged on ``new``."""
    delta = delta_pct = None
    if _is_number(old) and _is_number(new):
        delta = float(new) - float(old)
        delta_pct = 100.0 * delta / abs(float(old)) if old != 0 else None
    verdict = "not run" if not_run else _verdict(old, new, delta, direction, tolerance, comparable)
    return MetricDelta(
        phase=phase, gate=gate, metric=metric,
        old=None if old is _MISSING else old, new=None if new is _MISSING else new,
        delta=delta, delta_pct=delta_pct, threshold=threshold, tolerance=tolerance, verdict=verdict,
        target=str(target) if target is not None else None,
        target_met=target.check(new) if target is not None and new is not _MISSING else None,
        target_gap=target.gap(new) if target is not None and new is not _MISSING else None,
    )


def _verdict(old, new, delta, direction, tolerance, comparable) -> Verdict:
    if old is _MISSING:
        return "added"
    if new is _MISSING:
        return "removed"
    if delta is None:
        return "unchanged" if old == new else "changed"
    if delta == 0:
        return "unchanged"
    if direction is None:
        return "changed"
    if not comparable:
        return "not comparable"
    worse = delta < 0 if direction == "higher" else delta > 0
    if not worse:
        return "better"
    if tolerance is None:
        return "worse"
    relative = abs(delta) / abs(float(old)) if old != 0 else math.inf
    return "regression" if relative > tolerance else "within tolerance"


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
