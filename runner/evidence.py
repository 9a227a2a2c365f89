"""``runner advance --evidence``: run (or import) the gates of a phase that waits on an earlier one.

Phases are checkpointed in order, but work overlaps: the gates of a later phase can run while
an earlier one is unfinished. Their report is kept under ``reports/<plan>/<phase>/<run>/``,
marked ``evidence`` with the reason (``waiting on kernel``); the plan is never changed and
nothing is committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from runner.errors import ExitCode, UsageError
from runner.gates.preflight import check_calls
from runner.phase_run import Callbacks, GatesInterrupted, check_writes, judge, run_or_import, step_lines, write_up
from runner.plan.order import next_phase
from runner.records.machine import MachineInfo
from runner.records.results import ResultsFile
from runner.records.run_folder import ReportContext, RunMeta
from runner.repo.lock import repo_lock
from runner.runs import exit_code_for, interrupt_on_sigterm
from runner.workspace import Workspace


@dataclass
class EvidenceOutcome:
    """What ``record_evidence`` did; ``messages`` are lines for the user."""

    exit_code: ExitCode
    phase: str
    report: Path | None = None
    messages: list[str] = field(default_factory=list)


def record_evidence(
    ws: Workspace,
    phase_id: str | None,
    *,
    results: Sequence[Path] = (),
    dry_run: bool = False,
    machine: MachineInfo | None = None,
    callbacks: Callbacks = Callbacks(),
    wait_s: float | None = None,
) -> EvidenceOutcome:
    """Run (or import from the ``results`` files) the gates of ``phase_id``, a phase that waits
    on an earlier one, and keep them as evidence (see the module docstring).

    Refused (``UsageError``): the next phase itself (advance it), a complete phase (``runner
    gate`` checks it again), results of another plan, phase, gate definitions or tree, or a
    ``PASS`` whose metrics miss the plan's thresholds.
    """
    results = tuple(results)
    if phase_id is None:
        if not results:
            raise UsageError("--evidence needs the phase: --phase PHASE (or --results FILE)")
        held = list(dict.fromkeys(p.phase for path in results for p in ResultsFile.load(Path(path)).phases))
        if len(held) != 1:
            named = ", ".join(str(path) for path in results)
            raise UsageError(f"{named} hold{'s' if len(results) == 1 else ''} phases {', '.join(held) or 'none'}; "
                             "name one with --phase")
        phase_id = held[0]
    phase = ws.plan.phase(phase_id)
    upcoming = next_phase(ws.plan)
    if phase.status == "complete":
        raise UsageError(f"phase {phase.id} is complete; `runner gate {phase.id}` checks its gates again")
    if upcoming is not None and upcoming.id == phase.id:
        raise UsageError(f"{phase.id} is the next phase: `runner advance` (without --evidence) records its outcome")
    reason = f"waiting on {upcoming.id}" if upcoming is not None else "recorded as evidence"
    if not results:
        check_calls(ws.doc, phase, ws.root)
    check_writes(ws, phase, git=(ws.root / ".git").exists())
    if dry_run:
        lines = [f"plan {ws.plan.id} ({ws.plan_rel}): evidence for {phase.id} ({reason})",
                 *step_lines(ws, phase, results, machine),
                 "dry run: nothing was changed; the run would change no status and commit nothing"]
        return EvidenceOutcome(ExitCode.OK, phase.id, messages=lines)
    with interrupt_on_sigterm(), repo_lock(ws.root, "runner advance --evidence", wait_s=wait_s):
        own_files = list(results)
        fingerprint = ws.fingerprint(own_files)
        try:
            run = run_or_import(ws, phase, results=results, fingerprint=fingerprint, machine=machine,
                                callbacks=callbacks, base=None, evidence_reason=reason)
        except GatesInterrupted:
            return EvidenceOutcome(
                ExitCode.INTERRUPTED, phase.id,
                messages=[f"interrupted while running the gates of {phase.id}; the plan was not changed"],
            )
        phase_results = run.phase_results(phase.id)
        notes = [f"Evidence only, {reason}: this run changes no status and makes no checkpoint.", *run.notes]
        outcome, _ = judge(
            ws, phase, phase_results, run.steps, own_files, fingerprint, notes,
            changed=lambda now: "Every gate passed, but the tree changed while they ran.",
        )
        meta = RunMeta(role="evidence", recorded=False, reason=reason)
        context = ReportContext(ws.plan, phase, outcome, base=None, source=run.source, notes=notes, meta=meta)
        report = write_up(run.run.run_dir, run.run.results(ws, [phase_results]), context)
    report_rel = report.relative_to(ws.root).as_posix()
    return EvidenceOutcome(
        exit_code_for(outcome), phase.id, report=report,
        messages=[*run.notes, f"{phase.id}: evidence {outcome} ({reason}); report {report_rel}; "
                  "status unchanged, nothing committed"],
    )
