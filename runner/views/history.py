"""The history of a plan: its checkpoints, a run named by what a user types, and how a phase's
runs read. Reads only.

A complete phase records its checkpoint (tag, time, report path) in the plan; its runs are
under ``reports/`` (``runner.views.runs``). ``plan_checkpoints`` lists the checkpoints,
``resolve_run`` turns what a user types (a run id, a path to a results file or a run folder, a
``plan/phase`` tag) into one run, and ``describe_phase``, ``phase_headline`` and
``phase_targets`` say what ``status`` and the report show of a phase.
"""

from __future__ import annotations

from pathlib import Path

from runner.errors import UsageError
from runner.formatting import format_metric, one_line
from runner.plan.samples import MedianInterval
from runner.plan.schema import Plan
from runner.plan.thresholds import Threshold
from runner.records.machine import MachineInfo
from runner.records.checks import check_interval, check_thresholds
from runner.records.results import MetricCheck, ResultsFile
from runner.records.run_folder import REPORTS_DIR, headline_metrics, target_checks
from runner.views.runs import RESULTS_NAME, PhaseRuns, RunRecord, find_runs
from runner.views.status import CheckpointView, plan_status
from runner.workspace import Workspace


def plan_checkpoints(ws: Workspace) -> list[CheckpointView]:
    """The checkpoint of every phase that has one, in plan order (commits resolved from tags)."""
    return [phase.checkpoint for phase in plan_status(ws).phases if phase.checkpoint is not None]


def resolve_run(ws: Workspace, ref: str, *, cwd: Path | None = None) -> RunRecord:
    """The run ``ref`` names: a path to a results file or a run folder, a checkpoint tag
    (``plan/phase``), or a run id (or an unambiguous start of one) under ``reports/``."""
    for base in (Path(cwd or Path.cwd()), ws.root):
        candidate = base / ref
        if candidate.is_dir() and (candidate / RESULTS_NAME).is_file():
            candidate = candidate / RESULTS_NAME
        if candidate.is_file():
            return _record_for_path(ws, candidate)
    checkpoint = _checkpoint_named(ws, ref)
    if checkpoint is not None:
        path = ws.root / Path(checkpoint.report).parent / RESULTS_NAME
        if not path.is_file():
            raise UsageError(
                f"checkpoint {checkpoint.tag}: its report run has no {RESULTS_NAME} ({path})"
            )
        return _record_for_path(ws, path)
    scan = find_runs(ws.root, ws.plan.id)
    exact = [run for run in scan.runs if ref in (run.run_id, run.path.parent.name)]
    matches = exact or [run for run in scan.runs if run.path.parent.name.startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(run.path.parent.name for run in scan.runs[-5:]) or "none yet"
    if matches:
        raise UsageError(f"{ref!r} names {len(matches)} runs; give more of the run id (recent runs: {known})")
    raise UsageError(
        f"{ref!r} is not a results file, a run folder, a checkpoint tag or a run id of plan "
        f"{ws.plan.id!r} (recent runs: {known})"
    )


def _checkpoint_named(ws: Workspace, ref: str):
    for phase in ws.plan.phases:
        names = {f"{ws.plan.id}/{phase.id}"}
        if phase.checkpoint is not None:
            names.add(phase.checkpoint.tag)
        if ref in names:
            if phase.checkpoint is None:
                raise UsageError(f"phase {phase.id!r} has no checkpoint yet (status {phase.status})")
            return phase.checkpoint
    return None


def _record_for_path(ws: Workspace, path: Path) -> RunRecord:
    results = ResultsFile.load(path)
    phase = None
    try:
        rel = path.resolve().relative_to((ws.root / REPORTS_DIR).resolve())
    except ValueError:
        rel = None
    if rel is not None and len(rel.parts) == 4 and any(p.phase == rel.parts[1] for p in results.phases):
        phase = rel.parts[1]
    return RunRecord(path=path, results=results, phase=phase)


def gpu_of(machine: MachineInfo) -> str:
    """``NVIDIA H200`` (``x2`` for two), or the host name of a machine without a GPU."""
    if machine.gpu_name:
        return machine.gpu_name + (f" x{machine.gpu_count}" if machine.gpu_count > 1 else "")
    return f"{machine.hostname} (no GPU)"


_OUTCOME_WORDS = {"PASS": "passed", "FAIL": "failed", "ERROR": "errored", "BLOCKED": "blocked",
                  "SKIPPED": "skipped"}


def _counted(run: RunRecord) -> str:
    parts = [f"{n} gate{'s' if n != 1 else ''} {_OUTCOME_WORDS[outcome]}" if i == 0
             else f"{n} {_OUTCOME_WORDS[outcome]}"
             for i, (outcome, n) in enumerate(run.gate_counts().items())]
    return ", ".join(parts)


def describe_phase(status: str, runs: PhaseRuns | None, hostname: str | None = None) -> str:
    """``failed on NVIDIA H200 (run …); blocked here (run …, 1 gate passed, 3 blocked)``, and
    ``; evidence: PASS on NVIDIA H200 (run …), waiting on kernel`` for a phase that waits.
    A failed or blocked status names only a run whose outcome agrees with it; a newest verdict
    that does not (a pass whose checkpoint never came) follows as ``; last passed on …``.
    ``hostname``: this machine's, so its own runs read ``here``."""
    text = status
    if runs is None:
        return text
    cause = runs.cause(status)
    if cause is not None and cause is runs.verdict:
        text += f" on {gpu_of(cause.machine)} (run {cause.folder})"
    text += _blocked_text(runs.blocked, cause, hostname)
    text += _other_verdict_text(status, runs.verdict, cause)
    evidence = runs.evidence
    if evidence is not None:
        reason = f", {evidence.meta.reason}" if evidence.meta.reason else ""
        text += f"; evidence: {evidence.outcome} on {gpu_of(evidence.machine)} (run {evidence.folder}){reason}"
    return text


def _blocked_text(blocked: RunRecord | None, cause: RunRecord | None, hostname: str | None) -> str:
    """The newest blocked run: as the status itself when it is the cause, else as an aside."""
    if blocked is None:
        return ""
    if blocked is cause:
        return f" (run {blocked.folder}, {_counted(blocked)})"
    where = "here" if hostname and blocked.machine.hostname == hostname else f"on {gpu_of(blocked.machine)}"
    return f"; blocked {where} (run {blocked.folder}, {_counted(blocked)})"


def _other_verdict_text(status: str, verdict: RunRecord | None, cause: RunRecord | None) -> str:
    """A failed or blocked phase's newest verdict when it is not the cause: worth naming, as the
    newest run that decided anything, but never worded as the reason for the status."""
    if verdict is None or verdict is cause or status not in ("failed", "blocked"):
        return ""
    return f"; last {_OUTCOME_WORDS[verdict.outcome]} on {gpu_of(verdict.machine)} (run {verdict.folder})"


def phase_headline(plan: Plan, phase_id: str, checkpoint: CheckpointView | None,
                   runs: PhaseRuns | None) -> tuple[dict, str | None]:
    """The phase's headline metrics and where they come from: its checkpoint, else the run that
    explains its status (or the evidence that waits). What ``status`` and the report show."""
    shown = runs.shown if runs is not None else None
    if checkpoint is not None and checkpoint.metrics:
        metrics = dict(checkpoint.metrics)
        if shown is not None and _is_report_of(shown, checkpoint):
            # the plan keeps a sampled metric's median; its run keeps the samples, for the interval
            [results] = shown.phase_results()
            sampled = headline_metrics(plan.phase(phase_id), results.gates)
            metrics.update({name: value for name, value in sampled.items() if isinstance(value, list)
                            and name in metrics})
        return metrics, f"checkpoint {checkpoint.tag}"
    if shown is None:
        return {}, None
    [results] = shown.phase_results()
    metrics = headline_metrics(plan.phase(phase_id), results.gates)
    return metrics, (f"run {shown.run_id}" if metrics else None)


def _is_report_of(run: RunRecord, checkpoint: CheckpointView) -> bool:
    """Whether ``run`` is the run whose report the checkpoint names (its folder, in its phase)."""
    report = Path(checkpoint.report)
    return run.phase == checkpoint.phase and run.folder == report.parent.name and report.parent.parent.name == run.phase


def phase_targets(plan: Plan, phase_id: str, checkpoint: CheckpointView | None,
                  runs: PhaseRuns | None) -> tuple[list[MetricCheck], str | None]:
    """The phase's targets with where each stands, and where that comes from: the targets its
    checkpoint left open (a complete phase), else the plan's targets checked against the run
    that explains its status."""
    shown = runs.shown if runs is not None else None
    if checkpoint is not None:
        checks = [_open_target_check(name, open_target) for name, open_target in checkpoint.open_targets.items()]
        if checks and shown is not None and _is_report_of(shown, checkpoint):
            # the checkpoint's own run keeps the samples: its checks say where each target stood
            [results] = shown.phase_results()
            judged = {check.metric: check for check in target_checks(plan.phase(phase_id), results.gates)}
            checks = [judged[check.metric] if check.metric in judged and not judged[check.metric].ok else check
                      for check in checks]
        return checks, (f"checkpoint {checkpoint.tag}" if checks else None)
    if shown is None:
        return [], None
    [results] = shown.phase_results()
    checks = target_checks(plan.phase(phase_id), results.gates)
    return checks, (f"run {shown.run_id}" if checks else None)


def _open_target_check(name: str, open_target: dict) -> MetricCheck:
    """A target the checkpoint left open, as a check: judged again on its interval where the
    metric was sampled (its median may meet the target while the interval does not), and
    open in any case: the checkpoint's verdict stands, a view never closes a target."""
    threshold = Threshold.parse(open_target["target"])
    if open_target.get("samples") is not None:
        check = check_interval(name, threshold, MedianInterval(
            n=open_target["samples"], median=open_target["value"], low=open_target["low"], high=open_target["high"],
            confidence=open_target["confidence"]))
    else:
        metrics = {} if open_target["value"] is None else {name: open_target["value"]}
        [check] = check_thresholds({name: threshold}, metrics)
    if check.ok:  # a sampled metric recorded before intervals were: the median alone cannot say how short
        check = check.model_copy(update={"ok": False, "gap": None, "reason": f"{check.reason}; left open on its samples"})
    return check


def describe_targets(checks: list[MetricCheck]) -> str:
    """``1 of 3 met; open: x 0.63 (>= 0.80, 0.17 short)``: where targets stand, for a terminal."""
    if not checks:
        return ""
    open_ones = [check for check in checks if not check.ok]
    text = f"{len(checks) - len(open_ones)} of {len(checks)} met"
    if open_ones:
        text += "; open: " + ", ".join(
            f"{one_line(check.metric)} {format_metric(check.value) if check.value is not None else 'not reported'} "
            f"({check.threshold}, {check.shortfall})"
            for check in open_ones
        )
    return text
