"""``runner history PHASE --changes``: where each thresholded metric's level moved. Reads only.

A metric is followed when a gate of the phase has a threshold (``expect``) or a target on it.
Its series is the phase's runs under ``reports/`` (oldest first) in which the gate ran (``PASS``
or ``FAIL``) and reported it as a number or samples, one series per machine fingerprint (the
machine the gate ran on: for a record combined from several files, its source's), since
timings compare only on one. ``runner.plan.changepoints.find_changes`` finds the level changes,
with the gate's ``tolerance`` for the metric as the smallest move that counts (the default
tolerance without one) and the gate's confidence.

Decisions:

- ``ERROR`` gates are left out (what they reported is not a measurement the runner judged),
  as are ``BLOCKED`` and ``SKIPPED`` ones (nothing was measured); evidence runs and runs the
  plan did not record are measurements like any other and count.
- A change names the run where the new level starts and, when one exists, the commit that
  added that run's ``results.json`` (its checkpoint, or the commit of a failed run's report);
  before and after are the levels of the two segments, and ``better`` or ``worse`` follows the
  threshold's direction (the target's without one).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from runner.errors import GitError
from runner.plan.changepoints import find_changes
from runner.plan.samples import is_samples, sample_problem
from runner.plan.schema import DEFAULT_TOLERANCE, Gate, Phase
from runner.repo import git
from runner.views.runs import RunRecord, describe_machine
from runner.workspace import Workspace

RAN = ("PASS", "FAIL")


@dataclass(frozen=True)
class Series:
    """One metric of one gate on one machine fingerprint: the runs that measured it (oldest
    first) and their samples."""

    phase: str
    gate: str
    metric: str
    machine_fingerprint: str
    machine: str
    runs: list[RunRecord]
    samples: list[list[float]]


@dataclass(frozen=True)
class LevelChange:
    """A level change of a metric: ``run_id`` (its folder ``run``) is the first run of the new
    level, recorded by ``commit`` when one added it; ``relative`` is ``(after - before) /
    |before|``; ``verdict`` is ``better`` or ``worse`` (the threshold's direction); ``floor`` the
    smallest relative move that counted."""

    phase: str
    gate: str
    metric: str
    machine_fingerprint: str
    machine: str
    run_id: str
    run: str
    time: str
    commit: str | None
    before: float
    after: float
    relative: float
    p_value: float
    verdict: str
    runs_before: int
    runs_after: int
    floor: float

    def to_json(self) -> dict:
        data = asdict(self)
        data["relative"] = self.relative if math.isfinite(self.relative) else str(self.relative)
        return data


def metric_series(phase: Phase, runs: list[RunRecord]) -> list[Series]:
    """Every followed metric of ``phase`` per machine fingerprint, over ``runs`` (oldest first)."""
    found: dict[tuple[str, str, str], Series] = {}
    followed = [(gate, metric) for gate in phase.gates for metric in dict.fromkeys([*gate.expect, *gate.targets])]
    for run in runs:
        for phase_results in run.phase_results():
            if phase_results.phase != phase.id:
                continue
            results = {gate.name: gate for gate in phase_results.gates}
            for spec, metric in followed:
                result = results.get(spec.name)
                samples = _samples(result.metrics.get(metric)) if result is not None and result.outcome in RAN else None
                if samples is None:
                    continue
                machine = phase_results.machine_of(spec.name, run.machine)
                key = (spec.name, metric, machine.fingerprint)
                series = found.setdefault(key, Series(phase.id, spec.name, metric, machine.fingerprint,
                                                      describe_machine(machine), [], []))
                series.runs.append(run)
                series.samples.append(samples)
    return list(found.values())


def level_changes(ws: Workspace, phase: Phase, series: Series) -> list[LevelChange]:
    """The confirmed level changes of ``series`` (``runner.plan.changepoints``)."""
    spec = phase.gate(series.gate)
    floor = spec.tolerance.get(series.metric, DEFAULT_TOLERANCE)
    changes = []
    for change in find_changes(series.samples, floor=floor, confidence=spec.confidence):
        run = series.runs[change.index]
        changes.append(LevelChange(
            phase=series.phase, gate=series.gate, metric=series.metric,
            machine_fingerprint=series.machine_fingerprint, machine=series.machine,
            run_id=run.run_id, run=run.folder, time=run.results.created, commit=_commit(ws, run),
            before=change.before, after=change.after, relative=change.relative, p_value=change.p_value,
            verdict=_verdict(spec, series.metric, change.after - change.before),
            runs_before=change.runs_before, runs_after=change.runs_after, floor=floor,
        ))
    return changes


def _samples(value: object) -> list[float] | None:
    """A reported value as samples: a finite number as one, a list of finite numbers as itself."""
    if is_samples(value):
        return [float(x) for x in value] if sample_problem(value) is None else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return [float(value)]
    return None


def _verdict(spec: Gate, metric: str, delta: float) -> str:
    threshold = spec.expect.get(metric) or spec.targets.get(metric)
    higher = threshold is not None and threshold.op in (">=", ">")
    lower = threshold is not None and threshold.op in ("<=", "<")
    if not (higher or lower):
        return "moved"
    return "better" if (delta > 0) == higher else "worse"


def _commit(ws: Workspace, run: RunRecord) -> str | None:
    try:
        rel = run.path.resolve().relative_to(ws.root.resolve()).as_posix()
    except ValueError:
        return None
    try:
        return git.adding_commit(ws.root, rel)
    except GitError:  # no git binary here (a GPU host's copy)
        return None
