"""A run: its identity, its folder, running one phase's gates in it, and what its outcome means.

``RunContext`` is what every run carries (run id, creation time, tree fingerprint, machine,
run folder) and builds the run's ``ResultsFile``; ``gate`` and ``advance`` start one each.
``run_phase`` runs one phase's planned steps, ``exit_code_for`` maps an outcome to the
command's exit code, and ``interrupt_on_sigterm`` makes SIGTERM end a run the way Ctrl-C does.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import runner
from runner.errors import ExitCode, ReportError
from runner.gates.execute import ProgressFn, StartFn, run_steps
from runner.plan.order import GateStep
from runner.plan.schema import Phase
from runner.records.machine import MachineInfo
from runner.records.results import GateResult, Outcome, PhaseResults, ResultsFile
from runner.records.run_folder import REPORTS_DIR, safe_name
from runner.timeutil import iso_time, utc_now
from runner.workspace import Workspace

ResultFn = Callable[[str, GateResult], None]
"""Called with (phase id, result) as soon as each gate's result is known."""
PhaseStartFn = Callable[[str, str, Path], None]
"""Called with (phase id, gate name, log file) as a gate starts."""

PROGRAM = "runner"
"""How the user runs this command (``.venv/bin/runner``, ``python -m runner``); the command
line sets it, so hints name commands that work as typed."""


def set_program(name: str) -> None:
    global PROGRAM
    PROGRAM = name


def new_run_id(fingerprint: str, moment: datetime | None = None) -> str:
    """``20261129T235000Z-1a2b3c4d``: the UTC time and the first 8 hex of the fingerprint."""
    moment = moment or utc_now()
    digest = fingerprint.split(":", 1)[-1][:8]
    return f"{moment.astimezone(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{digest}"


def run_folder(root: Path, plan_id: str, phase_id: str, run_id: str) -> Path:
    """A fresh ``reports/<plan>/<phase>/<run-id>`` folder (``-2``, ``-3``... when taken), created;
    ``ReportError`` when it cannot be."""
    parent = Path(root) / REPORTS_DIR / safe_name(plan_id) / safe_name(phase_id)
    name, n = safe_name(run_id), 1
    try:
        parent.mkdir(parents=True, exist_ok=True)
        while True:
            candidate = parent / (name if n == 1 else f"{name}-{n}")
            try:
                candidate.mkdir()
                return candidate
            except FileExistsError:
                n += 1
    except OSError as exc:
        raise ReportError(
            f"cannot make the run's folder under {parent}: {exc.strerror or exc}; no gate ran and "
            f"nothing changed: make {REPORTS_DIR}/ a writable folder"
        ) from None


@dataclass(frozen=True)
class RunContext:
    """One run's identity: ``created`` is ISO 8601 UTC (seconds); ``run_dir`` is ``None`` for a
    check that keeps no report folder."""

    run_id: str
    created: str
    fingerprint: str
    machine: MachineInfo
    run_dir: Path | None = None

    @classmethod
    def start(cls, fingerprint: str, machine: MachineInfo, moment: datetime | None = None) -> RunContext:
        """A new run of the tree ``fingerprint`` on ``machine``, stamped now (or at ``moment``)."""
        moment = moment or utc_now()
        return cls(new_run_id(fingerprint, moment), iso_time(moment), fingerprint, machine)

    def in_reports(self, ws: Workspace, phase_id: str) -> RunContext:
        """The same run with its fresh folder under ``reports/<plan>/<phase>/`` (created)."""
        folder = run_folder(ws.root, ws.plan.id, phase_id, self.run_id)
        return RunContext(self.run_id, self.created, self.fingerprint, self.machine, folder)

    def results(self, ws: Workspace, phases: list[PhaseResults]) -> ResultsFile:
        """The run's results file holding ``phases``."""
        return ResultsFile(
            tool=runner.TOOL,
            plan_id=ws.plan.id,
            plan_path=ws.plan_rel,
            run_id=self.run_id,
            created=self.created,
            fingerprint=self.fingerprint,
            machine=self.machine,
            phases=phases,
        )


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
    on_start: PhaseStartFn | None = None,
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
        on_start=(lambda gate, log: on_start(phase.id, gate, log)) if on_start else None,
    )


def finish_elsewhere_hint(phase: Phase, steps: Sequence[GateStep]) -> str:
    """How to finish a phase whose gates need a device (or a Python module) this machine lacks."""
    blocked = [step.gate for step in steps if step.action == "blocked"]
    needs = sorted({device for gate in blocked for device in gate.required_devices()})
    modules = sorted({name for gate in blocked for name in gate.required_modules()})
    if modules:
        needs.append(("the Python module " if len(modules) == 1 else "the Python modules ") + ", ".join(modules))
    where = " and ".join(needs) if needs else "the devices its gates require"
    return (
        f"run `python -m runner gate {phase.id} --out results.json` in a copy of this tree on a "
        f"machine with {where}, copy results.json back, then `{PROGRAM} advance --results results.json`"
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
