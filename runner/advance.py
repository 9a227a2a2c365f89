"""``runner advance``: run the next phase's gates (or import their results) and checkpoint it.

The next phase is the first one that is not complete. Its gates run under the repository lock,
on a tree whose fingerprint is taken before and after; the evidence goes to
``reports/<plan>/<phase>/<run-id>/``. Then:

* every gate passed and the tree did not change: the phase becomes ``complete`` with its
  checkpoint record, and one commit (tagged ``<plan>/<phase>``) holds the plan file, the run's
  report folder and the phase's ``paths``, whose content must be the tree the gates ran on. The
  plan file is written only once the commit and its tag are published (``runner.repo.checkpoint``);
  a refused or failed commit leaves it as it was.
* a gate failed or errored, or the tree changed under the gates: ``failed``, no commit.
* a gate needs a device (or a Python module) this machine lacks: ``blocked``, no commit, and a message saying how
  to finish the phase on another machine. When the plan already holds a verdict on the phase
  from an earlier run (``failed`` or ``blocked``, its report under ``reports/``), a run that
  could only block leaves the plan as it is and writes only its own report.

Everything that can be refused without running a gate is refused first: the plan's calls and
paths, where the report goes, the git state, and whether the plan's bytes can take the new
status. ``--results`` checkpoints results measured elsewhere (``runner gate --out``) after
checking that they belong to this plan, phase, gate definitions and tree and that every
threshold holds; several ``--results`` files, each holding some of the phase's gates
(``runner gate --only``, or a job cut short), are combined into one record
(``runner.records.combine``), and one that leaves a gate uncovered is never checkpointed. A
results file is never part of the tree: like ``--out`` where it was made, it is left out of
the fingerprint wherever it lies, and one under the phase's paths (which the checkpoint
commits) is refused before anything is checked. An interrupt (Ctrl-C, SIGTERM) during the gates leaves the plan as it was.
``--evidence`` is ``runner.evidence``.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from runner.errors import ExitCode, GitError, UsageError
from runner.evidence import record_evidence
from runner.formatting import format_metric
from runner.gates.execute import ProgressFn
from runner.gates.preflight import check_calls
from runner.phase_run import Callbacks, PhaseRun, check_writes, judge, run_or_import, step_lines, write_up
from runner.plan.order import next_phase
from runner.plan.rewrite import PhaseUpdate, check_rewritable, render_updates, write_plan_text
from runner.plan.schema import Checkpoint, OpenTarget, Phase, PhaseStatus, plan_value
from runner.records.machine import MachineInfo
from runner.records.places import check_paths_committable, check_results_outside_paths
from runner.records.results import GateResult
from runner.records.run_folder import ReportContext, RunMeta, headline_metrics, mark_unrecorded
from runner.repo import checkpoint as checkpoints
from runner.repo import git
from runner.repo.fingerprint import TreeState
from runner.repo.lock import repo_lock
from runner.runs import PhaseStartFn, ResultFn, exit_code_for, interrupt_on_sigterm
from runner.timeutil import iso_time, utc_now
from runner.views.runs import RunRecord, describe_machine, find_runs
from runner.workspace import Workspace


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
    results: Sequence[Path] = (),
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

    ``results``: results files to import instead of running the gates (one file, or several
    that together hold every gate). ``phase_id``: the phase the caller means (it must be the
    next one). ``evidence``: record a run of a later phase as evidence instead
    (``runner.evidence.record_evidence``).

    ``wait_s``: when another runner holds the repository lock, wait up to that many seconds
    for it (``math.inf``: no limit) instead of refusing at once.
    """
    callbacks = Callbacks(on_result, on_progress, on_start)
    if evidence:
        outcome = record_evidence(ws, phase_id, results=results, dry_run=dry_run, machine=machine,
                                  callbacks=callbacks, wait_s=wait_s)
        return AdvanceOutcome(outcome.exit_code, phase=outcome.phase, report=outcome.report,
                              messages=outcome.messages)
    phase = next_phase(ws.plan)
    if phase is None:
        return AdvanceOutcome(ExitCode.OK, messages=[f"every phase of plan {ws.plan.id} is complete"])
    if phase_id is not None and phase_id != phase.id:
        ws.plan.phase(phase_id)  # an unknown phase is a usage error naming the known ones
        raise UsageError(
            f"phases are checkpointed in order and the next one is {phase.id}, not {phase_id}; "
            f"to record a run of {phase_id} as evidence while it waits, add --evidence"
        )
    results = tuple(results)
    _refuse_early(ws, phase, results)
    if dry_run:
        return _dry_run(ws, phase, results, machine)
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
        _refuse_early(ws, phase, results)
        base = _check_repo(ws.root)
        branch = git.current_branch(ws.root)  # the checkpoint lands here, or nowhere
        checkpoints.preflight(  # before any gate
            ws.root, tag=f"{ws.plan.id}/{phase.id}", expected_head=base, expected_branch=branch
        )
        try:
            return _advance_locked(ws, phase, base, branch, results, machine, callbacks)
        except KeyboardInterrupt:
            made = git.tag_commit(ws.root, f"{ws.plan.id}/{phase.id}")  # the interrupt came inside the checkpoint
            made = made if made is not None and made == git.head(ws.root) else None
            done = f"interrupted after checkpoint {made[:12]} of {phase.id} was made" if made else None
            return AdvanceOutcome(
                ExitCode.INTERRUPTED,
                phase=phase.id,
                messages=[done or f"interrupted while running the gates of {phase.id}; the plan was not changed"],
            )


def _refuse_early(ws: Workspace, phase: Phase, results: Sequence[Path]) -> None:
    """What can be refused before any gate runs: a ``call:`` that names no code (unless the
    gates ran elsewhere), paths and reports outside the repository, a path git ignores, a
    results file under the phase's paths, a plan whose bytes cannot take the phase's new status
    (``PlanError``)."""
    if not results:
        check_calls(ws.doc, phase, ws.root)
    check_writes(ws, phase, git=True)
    check_paths_committable(ws.doc, phase, ws.root)
    for path in results:
        check_results_outside_paths(phase, ws.root, path)
    check_rewritable(ws.doc, phase.id)


def _check_repo(root: Path) -> str:
    """``HEAD``, after checking a checkpoint can be made (``GitError`` otherwise)."""
    git.check_ready(root)
    base = git.head(root)
    if base is None:
        raise GitError(f"{root} has no commit yet; commit the tree before the runner checkpoints")
    return base


def _dry_run(ws: Workspace, phase: Phase, results: Sequence[Path], machine: MachineInfo | None) -> AdvanceOutcome:
    lines = [f"plan {ws.plan.id} ({ws.plan_rel}): next phase {phase.id} ({phase.status})",
             *step_lines(ws, phase, results, machine), "dry run: nothing was changed"]
    return AdvanceOutcome(ExitCode.OK, phase=phase.id, messages=lines)


def _advance_locked(
    ws: Workspace,
    phase: Phase,
    base: str,
    branch: str | None,
    results: Sequence[Path],
    machine: MachineInfo | None,
    callbacks: Callbacks,
) -> AdvanceOutcome:
    own_files = list(results)
    fingerprint = ws.fingerprint(own_files)
    run = run_or_import(ws, phase, results=results, fingerprint=fingerprint, machine=machine,
                        callbacks=callbacks, base=base)
    notes: list[str] = list(run.notes)
    phase_results = run.phase_results(phase.id)
    outcome, tested = judge(
        ws, phase, phase_results, run.steps, own_files, fingerprint, notes,
        changed=lambda now: (
            f"Every gate passed, but the tree changed while they ran (fingerprint {fingerprint} "
            f"at the start, {now} at the end), so nothing was committed. Run advance again on a "
            "tree that nobody edits meanwhile."
        ),
    )
    recorded = run.run.results(ws, [phase_results])
    held = _verdict_kept(ws, phase, run.run.run_dir) if outcome == "BLOCKED" else None
    meta = RunMeta()
    if held is not None:
        meta = RunMeta(recorded=False, reason=f"the plan keeps {phase.status} from run {held.folder}")
        notes.append(
            f"This run could not run every gate, so the plan keeps `{phase.status}` from run "
            f"{held.folder} ({describe_machine(held.machine)}); this report adds to it."
        )
    context = ReportContext(ws.plan, phase, outcome, base=base, source=run.source, notes=notes, meta=meta)
    report = write_up(run.run.run_dir, recorded, context)
    report_rel = report.relative_to(ws.root).as_posix()
    messages = list(notes)
    if outcome != "PASS":
        status: PhaseStatus = "blocked" if outcome == "BLOCKED" else "failed"
        if held is not None:
            status = phase.status
            messages.append(
                f"{phase.id}: {outcome} here; the plan keeps {status} (run {held.folder}); "
                f"report {report_rel} (git ignores it); nothing committed"
            )
        else:
            _write_plan(ws, {phase.id: PhaseUpdate(status)})
            messages.append(
                f"{phase.id}: {outcome}; status {status}; report {report_rel}; nothing committed "
                f"(commit {ws.plan_rel} and the report together to keep this verdict)"
            )
        return AdvanceOutcome(
            exit_code_for(outcome), phase=phase.id, status=status, report=report, messages=messages
        )
    try:
        return _checkpoint(ws, phase, base, branch, run, tested, report, messages)
    except GitError as exc:
        mark_unrecorded(run.run.run_dir, f"the checkpoint was refused: {exc}")
        raise


def _checkpoint(
    ws: Workspace,
    phase: Phase,
    base: str,
    branch: str | None,
    run: PhaseRun,
    tested: TreeState,
    report: Path,
    messages: list[str],
) -> AdvanceOutcome:
    tag = f"{ws.plan.id}/{phase.id}"
    metrics = {name: plan_value(value) for name, value in headline_metrics(phase, run.gates).items()}
    checkpoint = Checkpoint(
        tag=tag,
        base=base,
        fingerprint=tested.fingerprint,
        time=iso_time(utc_now()),
        report=report.relative_to(ws.root).as_posix(),
        metrics=metrics,
        open_targets=open_targets(run.gates),
    )
    message = commit_message(ws.plan.id, phase, tested.fingerprint, run.run.machine, run.gates, metrics)
    sha = checkpoints.make_checkpoint(
        ws.root, plan_rel=ws.plan_rel, plan_before=ws.doc.text.encode("utf-8"),
        plan_text=checkpoints.plan_renderer(ws.plan_path, {phase.id: PhaseUpdate("complete", checkpoint)}, ws.doc),
        paths=_existing_paths(ws.root, phase.paths), tested=tested.files,
        evidence=[run.run.run_dir.relative_to(ws.root).as_posix()],
        message=message, tag=tag, tag_message=message.split("\n", 1)[0], expected_head=base,
        expected_branch=branch, notes=messages,
    )
    messages.append(f"{phase.id}: PASS; checkpoint {sha[:12]} tagged {tag}; report {checkpoint.report}")
    if checkpoint.open_targets:
        messages.append(f"{phase.id}: targets left open: {', '.join(checkpoint.open_targets)}")
    return AdvanceOutcome(
        ExitCode.OK, phase=phase.id, status="complete", report=report, commit=sha, tag=tag, messages=messages
    )


def open_targets(gates: list[GateResult]) -> dict[str, OpenTarget]:
    """The targets the gates missed, by metric (the first gate's, when two aim at one metric),
    each value as the plan keeps it (``plan_value``)."""
    found: dict[str, OpenTarget] = {}
    for gate in gates:
        for check in gate.targets:
            if not check.ok and check.metric not in found:
                interval = {} if check.interval is None else {  # a sampled metric: what it was judged on
                    "low": check.interval[0], "high": check.interval[1], "samples": check.samples,
                    "confidence": check.confidence}
                found[check.metric] = OpenTarget(target=check.threshold, value=plan_value(check.value), **interval)
    return found


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
    for rel in dict.fromkeys(posixpath.normpath(rel) for rel in paths):  # "src/", "./src": "src"
        clean = rel
        if (root / clean).exists() or (root / clean).is_symlink() or git.is_tracked(root, clean):
            kept.append(clean)
    return kept
