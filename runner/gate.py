"""``runner gate``: run phases' gates as a read-only check, and what every command shares.

The check changes no file except the ``--out`` results file and the ``--logs`` folder (when
given; otherwise logs go to a temporary folder that is deleted, their tails kept in the
results), makes no commit and takes no lock, so it can run in CI and on a GPU host that holds
a plain copy of the tree (no ``.git``).

Shared with ``advance`` and ``status``: finding the repository root and the plan
(``open_workspace``), the tree fingerprint with the plan file and ``reports/`` left out, running
one phase's gates (``run_phase``) and the message that says how to finish blocked gates on
another machine.
"""

from __future__ import annotations

import signal
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from runner import machine as machine_probe
from runner.errors import ExitCode, UsageError
from runner.execute import ProgressFn, run_steps
from runner.fingerprint import tree_fingerprint
from runner.junit import append_summary, write_junit
from runner.machine import MachineInfo
from runner.planfile import PlanDocument, find_plan, load_plan
from runner.planning import GateStep, plan_run
from runner.preflight import check_calls
from runner.report import REPORTS_DIR, TOOL, new_run_id
from runner.results import GateResult, Outcome, PhaseResults, ResultsFile, combine_outcomes
from runner.timeutil import iso_time, utc_now
from runner.schema import Phase, Plan

ResultFn = Callable[[str, GateResult], None]
"""Called with (phase id, result) as soon as each gate's result is known."""


# --- the workspace ------------------------------------------------------------------------------


def find_repo_root(start: Path | None = None) -> Path:
    """The nearest folder from ``start`` (default: the working directory) upwards that has a
    ``.git``; ``start`` itself when there is none (a GPU host's copy of the tree)."""
    start = Path(start or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return start


@dataclass(frozen=True)
class Workspace:
    """The repository root, the plan file and the plan as loaded."""

    root: Path
    plan_path: Path
    doc: PlanDocument

    @property
    def plan(self) -> Plan:
        return self.doc.plan

    @property
    def plan_rel(self) -> str:
        """The plan's path relative to the root (POSIX), or absolute when it lies outside."""
        try:
            return self.plan_path.resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return str(self.plan_path)

    def fingerprint(self, also_exclude: Sequence[Path] = ()) -> str:
        """The tree fingerprint, without the plan file and ``reports/``.

        ``also_exclude`` names the runner's own files for this command (a results file, a logs
        folder): those inside the root are left out too, so writing or copying them into the
        tree does not change the fingerprint.
        """
        exclude = [self.plan_rel, REPORTS_DIR]
        for path in also_exclude:
            try:
                exclude.append(Path(path).resolve().relative_to(self.root.resolve()).as_posix())
            except ValueError:
                continue  # outside the tree: not part of the fingerprint anyway
        return tree_fingerprint(self.root, exclude=exclude)

    def reload(self) -> Workspace:
        return Workspace(self.root, self.plan_path, load_plan(self.plan_path))


def open_workspace(plan: Path | None = None, cwd: Path | None = None) -> Workspace:
    """Find the root from ``cwd``, the plan (``find_plan``) and load it."""
    root = find_repo_root(cwd)
    explicit = plan
    if explicit is not None and cwd is not None and not explicit.is_absolute():
        explicit = Path(cwd) / explicit
    plan_path = find_plan(root, explicit)
    return Workspace(root, plan_path, load_plan(plan_path))


def probe() -> MachineInfo:
    """This machine (``RUNNER_DEVICES`` overrides the detected devices)."""
    return machine_probe.probe_machine()


# --- running a phase ----------------------------------------------------------------------------


def run_phase(
    ws: Workspace,
    phase: Phase,
    steps: Sequence[GateStep],
    *,
    log_dir: Path,
    report_dir: Path,
    on_result: ResultFn | None = None,
    on_progress: ProgressFn | None = None,
    keep_going: bool = False,
) -> list[GateResult]:
    """Run ``steps`` of ``phase`` in order (stopping at the first failure unless ``keep_going``);
    logs in ``log_dir``."""
    return run_steps(
        steps,
        repo_root=ws.root,
        log_dir=log_dir,
        report_dir=report_dir,
        on_result=(lambda result: on_result(phase.id, result)) if on_result else None,
        on_progress=on_progress,
        keep_going=keep_going,
    )


def finish_elsewhere_hint(phase: Phase, steps: Sequence[GateStep]) -> str:
    """How to finish a phase whose gates need a device this machine lacks."""
    devices = sorted({req for step in steps if step.action == "blocked" for req in step.gate.requires})
    where = " and ".join(devices) if devices else "the devices its gates require"
    return (
        f"run `runner gate {phase.id} --out results.json` on a machine with {where}, "
        "copy results.json back, then `runner advance --results results.json`"
    )


def exit_code_for(outcome: Outcome) -> ExitCode:
    """FAIL or ERROR: 1; BLOCKED: 3; anything else: 0."""
    if outcome in ("FAIL", "ERROR"):
        return ExitCode.GATE_FAILED
    if outcome == "BLOCKED":
        return ExitCode.BLOCKED
    return ExitCode.OK


@contextmanager
def interrupt_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into ``KeyboardInterrupt`` inside the block (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# --- runner gate --------------------------------------------------------------------------------


@dataclass
class GateCheck:
    """What ``runner gate`` did: the results, the exit code and lines to show the user."""

    results: ResultsFile | None
    exit_code: ExitCode
    messages: list[str] = field(default_factory=list)


def select_phases(plan: Plan, phase_ids: Sequence[str], completed: bool) -> list[Phase]:
    """The phases named (in the order given), or every complete phase with ``completed``."""
    listing = ", ".join(f"{phase.id} ({phase.status})" for phase in plan.phases)
    if phase_ids and completed:
        raise UsageError(f"name phases or pass --completed, not both (phases: {listing})")
    if not phase_ids and not completed:
        raise UsageError(f"name the phase(s) to check, or pass --completed (phases: {listing})")
    if completed:
        return [phase for phase in plan.phases if phase.status == "complete"]
    chosen: dict[str, Phase] = {}
    for phase_id in phase_ids:
        chosen.setdefault(phase_id, plan.phase(phase_id))
    return list(chosen.values())


def check_phases(
    ws: Workspace,
    phase_ids: Sequence[str] = (),
    *,
    completed: bool = False,
    out: Path | None = None,
    logs: Path | None = None,
    junit: Path | None = None,
    summary: Path | None = None,
    machine: MachineInfo | None = None,
    on_result: ResultFn | None = None,
    on_progress: ProgressFn | None = None,
    keep_going: bool = False,
) -> GateCheck:
    """Run the gates of the selected phases; write ``out`` when given. Changes nothing else.

    ``junit`` (JUnit XML) and ``summary`` (Markdown, appended) are written for CI whenever the
    gates ran, also when the tree changed under them; like ``out`` and ``logs`` they are left
    out of the tree fingerprint.
    """
    phases = select_phases(ws.plan, phase_ids, completed)
    if not phases:
        return GateCheck(None, ExitCode.OK, ["no phase is complete yet; nothing to check"])
    for phase in phases:  # a misnamed `call` is a plan error before any gate runs
        check_calls(ws.doc, phase, ws.root)
    machine = machine or probe()
    devices = frozenset(machine.devices)
    own_files = [Path(path) for path in (out, logs, junit, summary) if path is not None]
    fingerprint = ws.fingerprint(own_files)
    created = utc_now()
    phase_results: list[PhaseResults] = []
    messages: list[str] = []
    with tempfile.TemporaryDirectory(prefix="runner-logs-") as scratch:
        log_root = Path(logs) if logs is not None else Path(scratch)
        for phase in phases:
            steps = plan_run(phase, devices)
            gates = run_phase(
                ws,
                phase,
                steps,
                log_dir=log_root / phase.id,
                report_dir=log_root,
                on_result=on_result,
                on_progress=on_progress,
                keep_going=keep_going,
            )
            results = PhaseResults(phase=phase.id, gates=gates)
            phase_results.append(results)
            if results.outcome == "BLOCKED":
                messages.append(f"{phase.id}: blocked; {finish_elsewhere_hint(phase, steps)}")
    outcome = combine_outcomes(results.outcome for results in phase_results)
    exit_code = exit_code_for(outcome)
    results_file = ResultsFile(
        tool=TOOL,
        plan_id=ws.plan.id,
        plan_path=ws.plan_rel,
        run_id=new_run_id(fingerprint, created),
        created=iso_time(created),
        fingerprint=fingerprint,
        machine=machine,
        phases=phase_results,
    )
    messages += _write_ci_files(results_file, junit=junit, summary=summary)
    if ws.fingerprint(own_files) != fingerprint:
        messages.append(
            "the tree changed while the gates ran, so these results describe no single tree"
            + ("; the results file was not written" if out is not None else "")
        )
        return GateCheck(results_file, ExitCode.GATE_FAILED, messages)
    if out is not None:
        results_file.dump(Path(out))
        messages.append(f"results written to {out}")
    return GateCheck(results_file, exit_code, messages)


def _write_ci_files(results: ResultsFile, *, junit: Path | None, summary: Path | None) -> list[str]:
    """Write the JUnit XML and append the Markdown summary; say what was written."""
    messages = []
    if junit is not None:
        write_junit(Path(junit), results)
        messages.append(f"JUnit XML written to {junit}")
    if summary is not None:
        append_summary(Path(summary), results)
        messages.append(f"summary written to {summary}")
    return messages
