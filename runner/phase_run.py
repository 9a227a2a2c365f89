"""One run of a phase for ``advance``: its gates run here or imported, judged, and written up.

``run_or_import`` makes the run's folder under ``reports/`` and fills it with gate results,
from this machine's gates or from results files measured elsewhere
(``runner.records.combine.import_results``: one file, or several that each hold some of the
phase's gates). ``judge`` turns the phase's results into the
run's outcome (a pass on a tree that changed under the gates is a failure). ``write_up`` writes
the report and turns a disk that refuses it into a ``ReportError``. An interrupt while the gates
run writes what finished, the interrupted gate with its time and log, and raises
``GatesInterrupted``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from runner.errors import ReportError
from runner.gates.execute import ProgressFn
from runner.gates.requirements import found_modules
from runner.plan.order import GateStep, plan_run
from runner.plan.schema import Phase
from runner.records import machine as machine_probe
from runner.records.binding import gate_definitions
from runner.records.combine import NOT_COVERED, import_results
from runner.records.machine import MachineInfo
from runner.records.places import check_paths, check_reports, check_run_folder
from runner.records.results import GateResult, Outcome, PhaseResults, ResultsFile
from runner.records.run_folder import ReportContext, RunMeta, write_report
from runner.records.run_folder import REPORTS_DIR, safe_name
from runner.repo.fingerprint import TreeState
from runner.runs import PhaseStartFn, ResultFn, RunContext, finish_elsewhere_hint, run_phase
from runner.timeutil import iso_ms
from runner.workspace import Workspace


class GatesInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM while the phase's gates ran; the interrupted run's report is written."""


@dataclass(frozen=True)
class Callbacks:
    """What the command line wants to hear while gates run (see ``runner.runs``)."""

    on_result: ResultFn | None = None
    on_progress: ProgressFn | None = None
    on_start: PhaseStartFn | None = None


@dataclass
class PhaseRun:
    """A run of one phase: its context and folder, the steps planned here (none for imported
    results), the gate results and where they come from; for results combined from several
    files, ``sources`` and ``notes`` (``runner.records.combine``)."""

    run: RunContext
    steps: list[GateStep]
    gates: list[GateResult]
    source: str
    definitions: dict | None = None
    sources: list | None = None
    notes: list[str] = field(default_factory=list)

    def phase_results(self, phase_id: str) -> PhaseResults:
        return PhaseResults(phase=phase_id, gates=self.gates, definitions=self.definitions, sources=self.sources)


def check_writes(ws: Workspace, phase: Phase, *, git: bool) -> None:
    """Before any gate: the phase's paths stay in the repository, and its run folder would be
    a writable folder of the repository that git does not ignore, reached through no symbolic
    link (``runner.records.places``)."""
    check_paths(ws.doc, phase, ws.root)
    parent = ws.root / REPORTS_DIR / safe_name(ws.plan.id) / safe_name(phase.id)
    check_reports(ws.root, REPORTS_DIR, parent, ws.plan_rel, git=git)
    check_run_folder(ws.root, REPORTS_DIR, parent)


def step_lines(ws: Workspace, phase: Phase, results: Sequence[Path], machine: MachineInfo | None) -> list[str]:
    """What a run of ``phase`` would do here, one line per gate (a dry run)."""
    if results:
        return [f"would check {', '.join(str(path) for path in results)} against the plan and the tree"]
    devices = frozenset((machine or machine_probe.probe_machine()).devices)
    return [
        f"  {step.gate.kind:<9} {step.gate.name}: " + ("run" if step.action == "run" else f"blocked: {step.reason}")
        for step in plan_run(phase, devices, found_modules(phase, ws.root))
    ]


def run_or_import(
    ws: Workspace,
    phase: Phase,
    *,
    results: Sequence[Path] = (),
    fingerprint: str,
    machine: MachineInfo | None,
    callbacks: Callbacks,
    base: str | None,
    evidence_reason: str | None = None,
) -> PhaseRun:
    """The phase's run with its folder made: imported from the ``results`` files or the gates
    run here. With ``evidence_reason`` the run is evidence for a phase that waits."""
    if results:
        imported = import_results(ws.plan, phase, results, fingerprint, evidence=evidence_reason is not None)
        held = imported.results
        run = RunContext(held.run_id, held.created, fingerprint, held.machine).in_reports(ws, phase.id)
        phase_results = held.phase(phase.id)
        source = f"results imported from {Path(results[0]).name} (run {run.run_id} on {run.machine.hostname})"
        if phase_results.sources is not None:
            source = "results combined from " + ", ".join(
                f"{item.file} (run {item.run_id} on {item.machine.hostname})" for item in phase_results.sources)
        return PhaseRun(run, [], list(phase_results.gates), source, phase_results.definitions,
                        phase_results.sources, list(imported.notes))
    run = RunContext.start(fingerprint, machine or machine_probe.probe_machine()).in_reports(ws, phase.id)
    steps = plan_run(phase, frozenset(run.machine.devices), found_modules(phase, ws.root))
    finished: list[GateResult] = []
    running: dict[str, object] = {}

    def started(phase_id: str, gate: str, log: Path) -> None:
        running.update(gate=gate, log=log, started=iso_ms(), t0=time.monotonic())
        if callbacks.on_start is not None:
            callbacks.on_start(phase_id, gate, log)

    def record(phase_id: str, result: GateResult) -> None:
        finished.append(result)
        running.clear()
        if callbacks.on_result is not None:
            callbacks.on_result(phase_id, result)

    try:
        gates = run_phase(ws, phase, steps, log_dir=run.run_dir, report_dir=run.run_dir, on_result=record,
                          on_progress=callbacks.on_progress, on_start=started)
    except KeyboardInterrupt as exc:
        gates = _interrupted_gates(steps, finished, running, run.run_dir)
        interrupted = run.results(ws, [PhaseResults(phase=phase.id, gates=gates, definitions=gate_definitions(phase))])
        meta = RunMeta(recorded=False, reason="interrupted; the plan was not changed")
        if evidence_reason is not None:
            meta = RunMeta(role="evidence", recorded=False, reason=f"{evidence_reason}; interrupted")
        _write_interrupted_report(ws, phase, base, interrupted, run.run_dir, meta)
        raise GatesInterrupted(*exc.args) from exc
    return PhaseRun(run, steps, gates, "local run", gate_definitions(phase))


def judge(
    ws: Workspace,
    phase: Phase,
    phase_results: PhaseResults,
    steps: list[GateStep],
    own_files: list[Path],
    fingerprint: str,
    notes: list[str],
    *,
    changed: Callable[[str], str],
) -> tuple[Outcome, TreeState | None]:
    """The run's outcome, with a note appended to ``notes`` where it needs one, and for a pass
    the tree as fingerprinted after the gates (what a checkpoint may commit): a ``PASS`` on a
    tree whose fingerprint is no longer ``fingerprint`` is a ``FAIL`` (``changed(now)`` says
    so), a ``BLOCKED`` one says how to finish elsewhere (unless only gates no imported file
    covered blocked it: the import's note names them), and ``SKIPPED`` (no gate ran, which a
    valid plan cannot give) is not a pass."""
    outcome = phase_results.outcome
    if outcome == "PASS":
        state = ws.tree_state(own_files)
        if state.fingerprint == fingerprint:
            return outcome, state
        notes.append(changed(state.fingerprint))
        return "FAIL", None
    blocked = [gate for gate in phase_results.gates if gate.outcome == "BLOCKED"]
    if outcome == "BLOCKED" and not all(gate.reason.startswith(NOT_COVERED) for gate in blocked):
        notes.append(f"Blocked: {finish_elsewhere_hint(phase, steps)}.")
    elif outcome == "SKIPPED":
        outcome = "FAIL"
    return outcome, None


def write_up(run_dir: Path, results: ResultsFile, context: ReportContext) -> Path:
    """``write_report``, with a disk that refuses it (a file in the way, read-only, full) as a
    ``ReportError`` naming the outcome that could not be recorded."""
    try:
        return write_report(run_dir, results, context)
    except OSError as exc:
        raise ReportError(
            f"cannot write the run's report in {run_dir}: {exc.strerror or exc}; the gates' outcome "
            f"({context.outcome}) is not recorded: the plan was not changed and nothing was committed"
        ) from None


def _interrupted_gates(
    steps: list[GateStep], finished: list[GateResult], running: dict, run_dir: Path | None
) -> list[GateResult]:
    """The gates that finished as they are, the one that was running ERROR (with the time it
    ran and its log), the rest SKIPPED."""
    gates = list(finished)
    for index, step in enumerate(steps[len(finished) :]):
        interrupted = index == 0 and step.action == "run"
        if not interrupted:
            gates.append(GateResult.not_run(step.gate, "SKIPPED", "not run: the run was interrupted"))
            continue
        result = GateResult.not_run(
            step.gate, "ERROR",
            "interrupted (SIGINT or SIGTERM) while it ran; its process group was ended, its log kept",
        )
        if running.get("gate") == step.gate.name:
            log = Path(running["log"])
            result = result.model_copy(update={
                "started": running["started"],
                "duration_s": round(time.monotonic() - running["t0"], 3),
                "log": log.name if run_dir is not None and log.parent == run_dir else None,
            })
        gates.append(result)
    return gates


def _write_interrupted_report(
    ws: Workspace, phase: Phase, base: str | None, results: ResultsFile, run_dir: Path, meta: RunMeta
) -> None:
    """Best effort, so that an interrupted run leaves its evidence: a failure here (or a
    second interrupt) leaves the logs the gates already wrote. The plan does not record it."""
    note = "Interrupted (SIGINT or SIGTERM): the plan was not changed and nothing was committed."
    context = ReportContext(ws.plan, phase, "INTERRUPTED", base=base, source="local run", notes=[note],
                            meta=meta)
    try:
        write_report(run_dir, results, context)
    except Exception:  # noqa: BLE001 - the interrupt is what the user must see, not this
        pass
