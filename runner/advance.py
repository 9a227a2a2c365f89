"""``runner advance``: run the next phase's gates (or import their results) and checkpoint it.

The next phase is the first one that is not complete. Its gates run under the repository lock,
on a tree whose fingerprint is taken before and after; the evidence goes to
``reports/<plan>/<phase>/<run-id>/``. Then:

* every gate passed and the tree did not change: the phase becomes ``complete`` with its
  checkpoint record, and one commit (tagged ``<plan>/<phase>``) holds the plan file, the run's
  report folder and the phase's ``paths``. The plan file is written only once the commit and
  its tag are published (``runner.repo.checkpoint``); a refused or failed commit leaves it as it was.
* a gate failed or errored, or the tree changed under the gates: ``failed``, no commit.
* a gate needs a device this machine lacks: ``blocked``, no commit, and a message saying how
  to finish the phase on another machine. When the plan already holds a verdict on the phase
  from an earlier run (``failed`` or ``blocked``, its report under ``reports/``), a run that
  could only block leaves the plan as it is and writes only its own report.

``--results`` checkpoints results measured elsewhere (``runner gate --out``) after checking that
they belong to this plan, phase and tree and that every threshold holds. An interrupt (Ctrl-C,
SIGTERM) during the gates leaves the plan as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from runner.repo import checkpoint as checkpoints
from runner.records import machine as machine_probe
from runner.errors import ExitCode, GitError, ResultsError, UsageError
from runner.gates.execute import ProgressFn
from runner.formatting import format_metric
from runner.repo import git
from runner.views.history import RunRecord, describe_machine, find_runs
from runner.repo.lock import repo_lock
from runner.records.machine import MachineInfo
from runner.plan.order import GateStep, next_phase, ordered_gates, plan_run
from runner.gates.preflight import check_calls
from runner.records.places import check_paths, check_reports
from runner.records.run_folder import ReportContext, RunMeta, headline_metrics, write_report
from runner.records.results import GateResult, Outcome, PhaseResults, ResultsFile, check_thresholds, plan_problems
from runner.plan.rewrite import PhaseUpdate, render_updates, write_plan_text
from runner.runs import (
    PhaseStartFn,
    ResultFn,
    RunContext,
    exit_code_for,
    finish_elsewhere_hint,
    interrupt_on_sigterm,
    run_phase,
)
from runner.plan.schema import Checkpoint, Phase, PhaseStatus
from runner.timeutil import iso_time, utc_now
from runner.workspace import REPORTS_DIR, Workspace, safe_name


@dataclass
class AdvanceOutcome:
    """What ``advance`` did; ``messages`` are lines for the user."""

    exit_code: ExitCode
    phase: str | None = None
    status: PhaseStatus | None = None
    report: Path | None = None
    commit: str | None = None
    tag: str | None = None
    messages: list[str] = field(default_factory=list)


def advance(
    ws: Workspace,
    *,
    results_path: Path | None = None,
    dry_run: bool = False,
    machine: MachineInfo | None = None,
    on_result: ResultFn | None = None,
    on_progress: ProgressFn | None = None,
    wait_s: float | None = None,
    phase_id: str | None = None,
    evidence: bool = False,
    on_start: PhaseStartFn | None = None,
) -> AdvanceOutcome:
    """Advance the plan of ``ws`` by one phase (see the module docstring).

    ``phase_id``: the phase the caller means (it must be the next one). ``evidence``: record a
    run of a later phase as evidence instead (``record_evidence``).

    ``wait_s``: when another runner holds the repository lock, wait up to that many seconds
    for it (``math.inf``: no limit) instead of refusing at once.
    """
    if evidence:
        return record_evidence(
            ws, phase_id, results_path=results_path, dry_run=dry_run, machine=machine,
            on_result=on_result, on_progress=on_progress, wait_s=wait_s, on_start=on_start,
        )
    phase = next_phase(ws.plan)
    if phase is None:
        return AdvanceOutcome(ExitCode.OK, messages=[f"every phase of plan {ws.plan.id} is complete"])
    if phase_id is not None and phase_id != phase.id:
        ws.plan.phase(phase_id)  # an unknown phase is a usage error naming the known ones
        raise UsageError(
            f"phases are checkpointed in order and the next one is {phase.id}, not {phase_id}; "
            f"to record a run of {phase_id} as evidence while it waits, add --evidence"
        )
    if results_path is None:
        check_calls(ws.doc, phase, ws.root)
    _check_writes(ws, phase, git=True)
    if dry_run:
        return _dry_run(ws, phase, results_path, machine)
    _check_repo(ws.root)
    with interrupt_on_sigterm(), repo_lock(ws.root, "runner advance", wait_s=wait_s):
        claimed = checkpoints.uncommitted_complete_tags(ws.root, ws.plan_rel)
        found = checkpoints.recover(ws.root, plan_rel=ws.plan_rel, complete_tags=claimed)  # a killed run's leftovers
        if found.problems:
            raise GitError("; ".join(found.problems))
        ws = ws.reload()  # the plan, HEAD and git state as they are now that we hold the lock
        phase = next_phase(ws.plan)
        if phase is None:
            return AdvanceOutcome(ExitCode.OK, messages=[f"every phase of plan {ws.plan.id} is complete"])
        if results_path is None:
            check_calls(ws.doc, phase, ws.root)
        _check_writes(ws, phase, git=True)
        base = _check_repo(ws.root)
        branch = git.current_branch(ws.root)  # the checkpoint lands here, or nowhere
        checkpoints.preflight(  # before any gate
            ws.root, tag=f"{ws.plan.id}/{phase.id}", expected_head=base, expected_branch=branch
        )
        try:
            return _advance_locked(
                ws, phase, base, branch, results_path, machine, on_result, on_progress, on_start
            )
        except KeyboardInterrupt:
            made = git.tag_commit(ws.root, f"{ws.plan.id}/{phase.id}")  # the interrupt came inside the checkpoint
            made = made if made is not None and made == git.head(ws.root) else None
            done = f"interrupted after checkpoint {made[:12]} of {phase.id} was made" if made else None
            return AdvanceOutcome(
                ExitCode.INTERRUPTED,
                phase=phase.id,
                messages=[done or f"interrupted while running the gates of {phase.id}; the plan was not changed"],
            )


class _GatesInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM while the phase's gates ran; the interrupted run's report is written."""


def _phase_gates(
    ws: Workspace,
    phase: Phase,
    results_path: Path | None,
    fingerprint: str,
    machine: MachineInfo | None,
    on_result: ResultFn | None,
    on_progress: ProgressFn | None,
    on_start: PhaseStartFn | None,
    *,
    base: str | None,
    evidence_reason: str | None = None,
) -> tuple[RunContext, list[GateStep], list[GateResult], str]:
    """The phase's run (its folder under ``reports/`` made), the steps it ran, its gate results
    and where they come from: imported from ``results_path`` (checked by
    ``load_matching_results``) or the gates run here. With ``evidence_reason`` the run is
    evidence for a phase that waits. An interrupt while the gates run writes the report of
    what finished, then raises ``_GatesInterrupted``."""
    if results_path is not None:
        imported = load_matching_results(ws, phase, results_path, fingerprint, evidence=evidence_reason is not None)
        run = RunContext(imported.run_id, imported.created, fingerprint, imported.machine).in_reports(ws, phase.id)
        source = f"results imported from {Path(results_path).name} (run {run.run_id} on {run.machine.hostname})"
        return run, [], list(imported.phase(phase.id).gates), source
    run = RunContext.start(fingerprint, machine or machine_probe.probe_machine()).in_reports(ws, phase.id)
    steps = plan_run(phase, frozenset(run.machine.devices))
    finished: list[GateResult] = []

    def record(phase_id: str, result: GateResult) -> None:
        finished.append(result)
        if on_result is not None:
            on_result(phase_id, result)

    try:
        gates = run_phase(ws, phase, steps, log_dir=run.run_dir, report_dir=run.run_dir, on_result=record,
                          on_progress=on_progress, on_start=on_start)
    except KeyboardInterrupt as exc:
        interrupted = run.results(ws, [PhaseResults(phase=phase.id, gates=_interrupted_gates(steps, finished))])
        meta = None
        if evidence_reason is not None:
            meta = RunMeta(role="evidence", recorded=False, reason=f"{evidence_reason}; interrupted")
        _write_interrupted_report(ws, phase, base, interrupted, run.run_dir, meta)
        raise _GatesInterrupted(*exc.args) from exc
    return run, steps, gates, "local run"


def _judge(
    ws: Workspace,
    phase: Phase,
    phase_results: PhaseResults,
    steps: list[GateStep],
    own_files: list[Path],
    fingerprint: str,
    notes: list[str],
    *,
    changed: Callable[[str], str],
) -> Outcome:
    """The run's outcome, with a note appended to ``notes`` where it needs one: a ``PASS`` on a
    tree whose fingerprint is no longer ``fingerprint`` is a ``FAIL`` (``changed(now)`` says
    so), a ``BLOCKED`` one says how to finish elsewhere, and ``SKIPPED`` (no gate ran, which a
    valid plan cannot give) is not a pass."""
    outcome = phase_results.outcome
    if outcome == "PASS":
        now = ws.fingerprint(own_files)
        if now != fingerprint:
            outcome = "FAIL"
            notes.append(changed(now))
    elif outcome == "BLOCKED":
        notes.append(f"Blocked: {finish_elsewhere_hint(phase, steps)}.")
    elif outcome == "SKIPPED":
        outcome = "FAIL"
    return outcome


def _interrupted_gates(steps: list[GateStep], finished: list[GateResult]) -> list[GateResult]:
    """The gates that finished as they are, the one that was running ERROR, the rest SKIPPED."""
    gates = list(finished)
    for index, step in enumerate(steps[len(finished) :]):
        running = index == 0 and step.action == "run"
        reason = (
            "interrupted (SIGINT or SIGTERM) while it ran; its process group was ended, its log kept"
            if running else "not run: the run was interrupted"
        )
        gates.append(GateResult.not_run(step.gate, "ERROR" if running else "SKIPPED", reason))
    return gates


def _write_interrupted_report(
    ws: Workspace, phase: Phase, base: str | None, results: ResultsFile, run_dir: Path,
    meta: RunMeta | None = None,
) -> None:
    """Best effort, so that an interrupted run leaves its evidence: a failure here (or a
    second interrupt) leaves the logs the gates already wrote. The plan does not record it."""
    note = "Interrupted (SIGINT or SIGTERM): the plan was not changed and nothing was committed."
    meta = meta or RunMeta(recorded=False, reason="interrupted; the plan was not changed")
    context = ReportContext(ws.plan, phase, "INTERRUPTED", base=base, source="local run", notes=[note],
                            meta=meta)
    try:
        write_report(run_dir, results, context)
    except Exception:  # noqa: BLE001 - the interrupt is what the user must see, not this
        pass


def _check_writes(ws: Workspace, phase: Phase, *, git: bool) -> None:
    """Before any gate: the phase's paths stay in the repository, and its run folder would be
    a folder of the repository that git does not ignore (``runner.gates.preflight``)."""
    check_paths(ws.doc, phase, ws.root)
    parent = ws.root / REPORTS_DIR / safe_name(ws.plan.id) / safe_name(phase.id)
    check_reports(ws.root, REPORTS_DIR, parent, ws.plan_rel, git=git)


def _check_repo(root: Path) -> str:
    """``HEAD``, after checking a checkpoint can be made (``GitError`` otherwise)."""
    git.check_ready(root)
    base = git.head(root)
    if base is None:
        raise GitError(f"{root} has no commit yet; commit the tree before the runner checkpoints")
    return base


def _dry_run(ws: Workspace, phase: Phase, results_path: Path | None, machine: MachineInfo | None) -> AdvanceOutcome:
    lines = [f"plan {ws.plan.id} ({ws.plan_rel}): next phase {phase.id} ({phase.status})"]
    if results_path is not None:
        lines.append(f"would check {results_path} against the tree and checkpoint {phase.id}")
    else:
        machine = machine or machine_probe.probe_machine()
        for step in plan_run(phase, frozenset(machine.devices)):
            what = "run" if step.action == "run" else f"blocked: {step.reason}"
            lines.append(f"  {step.gate.kind:<9} {step.gate.name}: {what}")
    lines.append("dry run: nothing was changed")
    return AdvanceOutcome(ExitCode.OK, phase=phase.id, messages=lines)


def _advance_locked(
    ws: Workspace,
    phase: Phase,
    base: str,
    branch: str | None,
    results_path: Path | None,
    machine: MachineInfo | None,
    on_result: ResultFn | None,
    on_progress: ProgressFn | None,
    on_start: PhaseStartFn | None = None,
) -> AdvanceOutcome:
    own_files = [results_path] if results_path is not None else []
    fingerprint = ws.fingerprint(own_files)
    notes: list[str] = []
    run, steps, gates, source = _phase_gates(
        ws, phase, results_path, fingerprint, machine, on_result, on_progress, on_start, base=base
    )
    phase_results = PhaseResults(phase=phase.id, gates=gates)
    outcome = _judge(
        ws, phase, phase_results, steps, own_files, fingerprint, notes,
        changed=lambda now: (
            f"Every gate passed, but the tree changed while they ran (fingerprint {fingerprint} "
            f"at the start, {now} at the end), so nothing was committed. Run advance again on a "
            "tree that nobody edits meanwhile."
        ),
    )
    results = run.results(ws, [phase_results])
    held = _verdict_kept(ws, phase, run.run_dir) if outcome == "BLOCKED" else None
    meta = RunMeta()
    if held is not None:
        meta = RunMeta(recorded=False, reason=f"the plan keeps {phase.status} from run {held.folder}")
        notes.append(
            f"This run could not run every gate, so the plan keeps `{phase.status}` from run "
            f"{held.folder} ({describe_machine(held.machine)}); this report adds to it."
        )
    context = ReportContext(ws.plan, phase, outcome, base=base, source=source, notes=notes, meta=meta)
    report = write_report(run.run_dir, results, context)
    report_rel = report.relative_to(ws.root).as_posix()
    messages = list(notes)
    if outcome != "PASS":
        status: PhaseStatus = "blocked" if outcome == "BLOCKED" else "failed"
        if held is not None:
            status = phase.status
            messages.append(
                f"{phase.id}: {outcome} here; the plan keeps {status} (run {held.folder}); "
                f"report {report_rel}; nothing committed"
            )
        else:
            _write_plan(ws, {phase.id: PhaseUpdate(status)})
            messages.append(f"{phase.id}: {outcome}; status {status}; report {report_rel}; nothing committed")
        return AdvanceOutcome(
            exit_code_for(outcome), phase=phase.id, status=status, report=report, messages=messages
        )
    return _checkpoint(
        ws, phase, base, branch, fingerprint, run.machine, gates, run.run_dir, report, messages
    )


def _checkpoint(
    ws: Workspace,
    phase: Phase,
    base: str,
    branch: str | None,
    fingerprint: str,
    machine: MachineInfo,
    gates: list[GateResult],
    run_dir: Path,
    report: Path,
    messages: list[str],
) -> AdvanceOutcome:
    tag = f"{ws.plan.id}/{phase.id}"
    metrics = headline_metrics(phase, gates)
    checkpoint = Checkpoint(
        tag=tag,
        base=base,
        fingerprint=fingerprint,
        time=iso_time(utc_now()),
        report=report.relative_to(ws.root).as_posix(),
        metrics=metrics,
    )
    paths = [ws.plan_rel, run_dir.relative_to(ws.root).as_posix(), *_existing_paths(ws.root, phase.paths)]
    message = commit_message(ws.plan.id, phase, fingerprint, machine, gates, metrics)
    sha = checkpoints.make_checkpoint(
        ws.root, plan_rel=ws.plan_rel, plan_before=ws.doc.text.encode("utf-8"),
        plan_text=checkpoints.plan_renderer(ws.plan_path, {phase.id: PhaseUpdate("complete", checkpoint)}, ws.doc),
        paths=paths, message=message, tag=tag, tag_message=message.split("\n", 1)[0], expected_head=base,
        expected_branch=branch, notes=messages,
    )
    messages.append(f"{phase.id}: PASS; checkpoint {sha[:12]} tagged {tag}; report {checkpoint.report}")
    return AdvanceOutcome(
        ExitCode.OK, phase=phase.id, status="complete", report=report, commit=sha, tag=tag, messages=messages
    )


def commit_message(
    plan_id: str,
    phase: Phase,
    fingerprint: str,
    machine: MachineInfo,
    gates: list[GateResult],
    metrics: dict[str, object],
) -> str:
    """``<plan>/<phase>: checkpoint (build PASS, ...)``, headline metrics, then the trailers."""
    return checkpoints.commit_message(
        plan_id, phase.id, fingerprint, machine.fingerprint, machine.gpu_name or "no GPU", machine.hostname,
        [(gate.name, gate.outcome) for gate in gates],
        {name: format_metric(value, digits=6) for name, value in metrics.items()},
    )


def record_evidence(
    ws: Workspace,
    phase_id: str | None,
    *,
    results_path: Path | None = None,
    dry_run: bool = False,
    machine: MachineInfo | None = None,
    on_result: ResultFn | None = None,
    on_progress: ProgressFn | None = None,
    wait_s: float | None = None,
    on_start: PhaseStartFn | None = None,
) -> AdvanceOutcome:
    """Run (or import from ``results_path``) the gates of ``phase_id``, a phase that waits on an
    earlier one, and keep them as evidence: a report under ``reports/<plan>/<phase>/<run>/``
    marked ``evidence`` with the reason. The plan is never changed and nothing is committed.

    Refused (``UsageError``): the next phase itself (advance it), a complete phase (``runner
    gate`` checks it again), results of another plan, phase or tree, or a ``PASS`` whose
    metrics miss the plan's thresholds.
    """
    if phase_id is None:
        if results_path is None:
            raise UsageError("--evidence needs the phase: --phase PHASE (or --results FILE)")
        held = [p.phase for p in ResultsFile.load(Path(results_path)).phases]
        if len(held) != 1:
            raise UsageError(f"{results_path} holds phases {', '.join(held) or 'none'}; name one with --phase")
        phase_id = held[0]
    phase = ws.plan.phase(phase_id)
    upcoming = next_phase(ws.plan)
    if phase.status == "complete":
        raise UsageError(
            f"phase {phase.id} is complete; `runner gate {phase.id}` checks its gates again"
        )
    if upcoming is not None and upcoming.id == phase.id:
        raise UsageError(
            f"{phase.id} is the next phase: `runner advance` (without --evidence) records its outcome"
        )
    reason = f"waiting on {upcoming.id}" if upcoming is not None else "recorded as evidence"
    if results_path is None:
        check_calls(ws.doc, phase, ws.root)
    _check_writes(ws, phase, git=(ws.root / ".git").exists())
    if dry_run:
        outcome = _dry_run(ws, phase, results_path, machine)
        outcome.messages[0] = f"plan {ws.plan.id} ({ws.plan_rel}): evidence for {phase.id} ({reason})"
        outcome.messages[-1] = "dry run: nothing was changed; the run would change no status and commit nothing"
        return outcome
    with interrupt_on_sigterm(), repo_lock(ws.root, "runner advance --evidence", wait_s=wait_s):
        own_files = [results_path] if results_path is not None else []
        fingerprint = ws.fingerprint(own_files)
        try:
            run, steps, gates, source = _phase_gates(
                ws, phase, results_path, fingerprint, machine, on_result, on_progress, on_start, base=None,
                evidence_reason=reason,
            )
        except _GatesInterrupted:
            return AdvanceOutcome(
                ExitCode.INTERRUPTED, phase=phase.id,
                messages=[f"interrupted while running the gates of {phase.id}; the plan was not changed"],
            )
        phase_results = PhaseResults(phase=phase.id, gates=gates)
        notes = [f"Evidence only, {reason}: this run changes no status and makes no checkpoint."]
        outcome = _judge(
            ws, phase, phase_results, steps, own_files, fingerprint, notes,
            changed=lambda now: "Every gate passed, but the tree changed while they ran.",
        )
        meta = RunMeta(role="evidence", recorded=False, reason=reason)
        context = ReportContext(ws.plan, phase, outcome, base=None, source=source, notes=notes, meta=meta)
        report = write_report(run.run_dir, run.results(ws, [phase_results]), context)
    report_rel = report.relative_to(ws.root).as_posix()
    return AdvanceOutcome(
        exit_code_for(outcome), phase=phase.id, report=report,
        messages=[f"{phase.id}: evidence {outcome} ({reason}); report {report_rel}; "
                  "status unchanged, nothing committed"],
    )


def load_matching_results(
    ws: Workspace, phase: Phase, path: Path, fingerprint: str, *, evidence: bool = False
) -> ResultsFile:
    """Load ``path`` and check it fits: plan, phase, tree, every gate of the phase present,
    and every threshold of a gate recorded PASS re-checked here. ``ResultsError`` names what
    differs. Gates recorded FAIL, ERROR, BLOCKED or SKIPPED are accepted as what they are: the
    phase is then recorded as failed or blocked, and only an all-PASS file checkpoints."""
    results = ResultsFile.load(Path(path))
    where = f"{path}:"
    if results.plan_id != ws.plan.id:
        raise ResultsError(f"{where} results are for plan {results.plan_id!r}, not {ws.plan.id!r}")
    held = [phase_results.phase for phase_results in results.phases]
    if phase.id not in held:
        what = "the phase named" if evidence else "the next phase to advance"
        hint = ""
        later = [p.id for p in ws.plan.phases if p.id in held and p.status != "complete"]
        if not evidence and later:
            hint = (f"; to keep them as evidence for {later[0]} while it waits, run "
                    f"`runner advance --evidence --results {path}`")
        raise ResultsError(
            f"{where} results hold phase(s) {', '.join(held) or 'none'}, not {phase.id!r} ({what}){hint}"
        )
    if results.fingerprint != fingerprint:
        raise ResultsError(
            f"{where} results were measured on tree {results.fingerprint}, but this tree is "
            f"{fingerprint}; run the gates again on this tree (or copy the same tree to the GPU host)"
        )
    recorded = {gate.name: gate for gate in results.phase(phase.id).gates}
    problems: list[str] = plan_problems(results.phase(phase.id).gates, ordered_gates(phase))
    for gate in phase.gates:
        result = recorded.get(gate.name)
        if result is None:
            problems.append(f"gate {gate.name!r} is missing")
            continue
        if result.outcome != "PASS":
            continue
        for check in check_thresholds(gate.expect, result.metrics):
            if not check.ok:
                problems.append(f"gate {gate.name!r}: {check.metric} {check.reason} (plan: {check.threshold})")
    if problems:
        doing = "record evidence for" if evidence else "checkpoint"
        raise ResultsError(f"{where} refusing to {doing} {phase.id}: " + "; ".join(problems))
    return results


def _verdict_kept(ws: Workspace, phase: Phase, run_dir: Path | None) -> RunRecord | None:
    """The earlier run whose verdict the plan records for ``phase``, when a run that could only
    block must leave it alone: the phase is ``failed`` or ``blocked`` and that run's report is
    under ``reports/``. ``None`` when the plan is to record ``blocked``."""
    if phase.status not in ("failed", "blocked"):
        return None
    earlier = [
        run for run in find_runs(ws.root, ws.plan.id, phase.id).runs
        if not run.evidence and run.meta.recorded and run.path.parent != run_dir
    ]
    if not earlier:
        return None
    informative = [run for run in earlier if run.informative]
    return (informative or earlier)[-1]


def _write_plan(ws: Workspace, updates: dict[str, PhaseUpdate]) -> None:
    text = render_updates(ws.doc, updates)
    if text != ws.doc.text:
        write_plan_text(ws.plan_path, text)


def _existing_paths(root: Path, paths: list[str]) -> list[str]:
    """The phase's paths that exist in the work tree or are tracked (deleted ones count)."""
    kept = []
    for rel in paths:
        clean = rel.rstrip("/") or rel
        if (root / clean).exists() or (root / clean).is_symlink() or git.is_tracked(root, clean):
            kept.append(clean)
    return kept

