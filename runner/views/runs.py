"""The runs under ``reports/<plan>/<phase>/<run-id>/``: finding them and reading them. Reads only.

Every run of a phase leaves ``results.json`` (and ``run.json``) in its folder. ``find_runs``
lists a plan's runs, ``find_shown_runs`` only those ``status`` shows, and ``phase_runs`` picks
per phase the run that explains its status (``PhaseRuns``).

Decisions:

- A view reads a results file only up to ``VIEW_MAX_RESULTS_BYTES``; a bigger one is named in
  the scan's ``skipped`` list from its size alone, never read.
- What a view keeps of a run is bounded too: each string metric (in ``metrics``, ``checks``
  and ``targets``) is cut as the plan cuts it (``plan_value``), so a history of many runs with
  long string metrics costs what their numbers cost.
- ``status`` needs, per phase, only the runs back to the newest verdict: ``find_shown_runs``
  reads run folders newest first (a run folder's name is its run id, which starts with its UTC
  time) and stops there; ``find_runs`` (``history``, the HTML page, ``diff``) reads every run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from runner.errors import ResultsError
from runner.formatting import CONTROL_CHARS, one_line
from runner.plan.schema import plan_value
from runner.records.machine import MachineInfo
from runner.records.results import MetricCheck, Outcome, PhaseResults, ResultsFile, combine_outcomes
from runner.records.run_folder import REPORTS_DIR, RunMeta, read_run_meta, safe_name

RESULTS_NAME = "results.json"

VIEW_MAX_RESULTS_BYTES = 16 << 20
"""The largest ``results.json`` a view reads. A run the runner wrote stays far below it (its
artifacts are files of their own, each gate's log tail at most 8 KiB and its metrics at most
the 1 MiB of its metrics file); a bigger file is skipped with a note saying so."""


@dataclass(frozen=True)
class RunRecord:
    """One results file: where it lies and what it holds.

    ``phase`` is the phase folder the run was found in (``None`` for a results file given by
    path, which may hold several phases).
    """

    path: Path
    results: ResultsFile
    phase: str | None = None
    meta: RunMeta = field(default_factory=RunMeta)

    @property
    def evidence(self) -> bool:
        return self.meta.evidence

    @property
    def folder(self) -> str:
        """The run folder's name: the run id, with ``-2``... when two runs shared one."""
        return self.path.parent.name

    @property
    def informative(self) -> bool:
        """A verdict on the phase: it ran every gate it could up to a FAIL, or passed. A run that
        only blocked (every gate PASS or BLOCKED) says what this machine could not do."""
        return self.outcome != "BLOCKED"

    def gate_counts(self) -> dict[str, int]:
        """How many gates of each outcome, in the order PASS, FAIL, ERROR, BLOCKED, SKIPPED."""
        counts: dict[str, int] = {}
        for outcome in ("PASS", "FAIL", "ERROR", "BLOCKED", "SKIPPED"):
            n = sum(gate.outcome == outcome for phase in self.phase_results() for gate in phase.gates)
            if n:
                counts[outcome] = n
        return counts

    @property
    def run_id(self) -> str:
        return self.results.run_id

    @property
    def created(self) -> datetime:
        return parse_time(self.results.created)

    @property
    def machine(self) -> MachineInfo:
        return self.results.machine

    @property
    def outcome(self) -> Outcome:
        """The outcome of ``phase`` in this run (of every phase when ``phase`` is ``None``)."""
        return combine_outcomes(results.outcome for results in self.phase_results())

    def phase_results(self) -> list[PhaseResults]:
        """The phase this run was found under, or every phase of a file given by path."""
        return self.results.phases if self.phase is None else [self.results.phase(self.phase)]

    def metrics(self) -> dict[tuple[str, str, str], object]:
        """Every reported metric, keyed by (phase, gate, metric), in the order reported."""
        return {
            (phase.phase, gate.name, name): value
            for phase in self.phase_results()
            for gate in phase.gates
            for name, value in gate.metrics.items()
        }

    def to_json(self, root: Path | None = None) -> dict:
        return {
            "run_id": self.run_id,
            "phase": self.phase,
            "phases": [p.phase for p in self.phase_results()],
            "time": self.results.created,
            "outcome": self.outcome,
            "machine": describe_machine(self.machine),
            "machine_fingerprint": self.machine.fingerprint,
            "fingerprint": self.results.fingerprint,
            "path": display_path(self.path, root),
            "role": self.meta.role,
            "recorded": self.meta.recorded,
            "reason": self.meta.reason,
        }


@dataclass(frozen=True)
class RunScan:
    """The runs found (oldest first) and the results files that could not be read."""

    runs: list[RunRecord]
    skipped: list[str] = field(default_factory=list)


def parse_time(text: str) -> datetime:
    """``2026-11-29T23:50:00Z`` (or any ISO 8601 time) as an aware UTC datetime."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def describe_machine(machine: MachineInfo) -> str:
    """``vm: NVIDIA H200`` (``x2`` for two GPUs), ``ci: no GPU``."""
    gpu = machine.gpu_name or "no GPU"
    if machine.gpu_count > 1:
        gpu += f" x{machine.gpu_count}"
    return f"{machine.hostname}: {gpu}"


def display_path(path: Path, root: Path | None) -> str:
    """``path`` relative to ``root`` when inside it (POSIX), else as given."""
    if root is not None:
        try:
            return Path(path).resolve().relative_to(Path(root).resolve()).as_posix()
        except ValueError:
            pass
    return str(path)


def find_runs(root: Path, plan_id: str, phase: str | None = None) -> RunScan:
    """Every ``reports/<plan>/<phase>/<run-id>/results.json`` of the plan (of one phase when
    ``phase`` is given), oldest first.

    What the runner did not write is skipped and named in ``skipped``, never a crash: a folder
    whose name is not printable UTF-8, a results file over ``VIEW_MAX_RESULTS_BYTES`` or that
    does not load, a run whose results hold no phase of the folder it lies in (copied from
    another phase).
    """
    runs: list[RunRecord] = []
    skipped: list[str] = []
    for phase_dir in _phase_dirs(root, plan_id, phase):
        for path in sorted(phase_dir.glob(f"*/{RESULTS_NAME}")):
            record = _load_run(root, phase_dir, path, skipped)
            if record is not None:
                runs.append(record)
    runs.sort(key=lambda run: (run.created, run.run_id, run.phase or ""))
    return RunScan(runs, skipped)


def find_shown_runs(root: Path, plan_id: str) -> tuple[dict[str, PhaseRuns], list[str]]:
    """``phase_runs(find_runs(root, plan_id))`` and the scan's ``skipped``, reading only the
    runs each phase shows: its run folders newest first, back to its newest verdict. ``count``
    is the number of run folders holding a ``results.json``."""
    found: dict[str, PhaseRuns] = {}
    skipped: list[str] = []
    for phase_dir in _phase_dirs(root, plan_id, None):
        paths = sorted(phase_dir.glob(f"*/{RESULTS_NAME}"), key=lambda path: path.parent.name, reverse=True)
        newer: list[RunRecord] = []
        for path in paths:
            record = _load_run(root, phase_dir, path, skipped)
            if record is None:
                continue
            newer.append(record)
            if not record.evidence and record.informative and record.meta.recorded:
                break  # the verdict: nothing older is shown
        newer.reverse()  # oldest first again: runs of one second keep their folders' order (X, X-2)
        newer.sort(key=lambda run: (run.created, run.run_id))
        runs = phase_runs(RunScan(newer)).get(phase_dir.name)
        if runs is not None:
            found[phase_dir.name] = PhaseRuns(runs.verdict, runs.blocked, runs.evidence, count=len(paths))
    return found, skipped


def _phase_dirs(root: Path, plan_id: str, phase: str | None) -> list[Path]:
    plan_dir = Path(root) / REPORTS_DIR / safe_name(plan_id)
    return [plan_dir / safe_name(phase)] if phase else sorted(p for p in plan_dir.glob("*") if p.is_dir())


def _load_run(root: Path, phase_dir: Path, path: Path, skipped: list[str]) -> RunRecord | None:
    """The run whose results are ``path`` as a view keeps it, or ``None`` with a line appended
    to ``skipped`` saying why not."""
    shown = display_path(path, root)
    if not _plain_name(phase_dir.name) or not _plain_name(path.parent.name):
        skipped.append(f"{one_line(shown)}: a folder name that is not printable UTF-8; skipped")
        return None
    try:
        size = path.stat().st_size
    except OSError as error:
        skipped.append(f"{shown}: cannot read it ({error.strerror or error}); skipped")
        return None
    if size > VIEW_MAX_RESULTS_BYTES:
        skipped.append(f"{shown}: {size / (1 << 20):.0f} MiB, more than the {VIEW_MAX_RESULTS_BYTES >> 20} MiB "
                       "a view reads of a results file; skipped (its report.md shows the run)")
        return None
    try:
        results = ResultsFile.load(path)
    except ResultsError as error:
        skipped.append(str(error))
        return None
    if phase_dir.name not in {p.phase for p in results.phases}:
        held = ", ".join(p.phase for p in results.phases)
        skipped.append(f"{shown}: holds the results of phase {held}, not of {phase_dir.name} "
                       "whose folder it lies in (copied?); skipped")
        return None
    return RunRecord(path=path, results=_bounded(results), phase=phase_dir.name, meta=read_run_meta(path.parent))


def _bounded(results: ResultsFile) -> ResultsFile:
    """``results`` with every string metric cut as the plan cuts it (``plan_value``)."""
    def checks(items: list[MetricCheck]) -> list[MetricCheck]:
        return [item.model_copy(update={"value": plan_value(item.value)}) if isinstance(item.value, str) else item
                for item in items]

    phases = []
    for phase_results in results.phases:
        gates = [
            gate.model_copy(update={
                "metrics": {name: plan_value(value) if isinstance(value, str) else value
                            for name, value in gate.metrics.items()},
                "checks": checks(gate.checks),
                "targets": checks(gate.targets),
            })
            for gate in phase_results.gates
        ]
        phases.append(phase_results.model_copy(update={"gates": gates}))
    return results.model_copy(update={"phases": phases})


def _plain_name(name: str) -> bool:
    """A folder name the views can print and link: valid UTF-8, no control characters."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a non-UTF-8 byte, read as a lone surrogate
        return False
    return not CONTROL_CHARS.search(name)


def latest_runs(scan: RunScan) -> dict[str, RunRecord]:
    """The newest informative run of each phase (``PhaseRuns.shown``): a run that only blocked
    never hides the verdict of an earlier run, and evidence shows when there is nothing else."""
    return {phase: runs.shown for phase, runs in phase_runs(scan).items() if runs.shown is not None}


@dataclass(frozen=True)
class PhaseRuns:
    """A phase's runs as ``status`` and the report summarise them.

    ``verdict``: the newest informative run of the phase's own (``role`` run); ``blocked``: a
    newer run that only blocked; ``evidence``: the newest evidence run (a run made while the
    phase waited on an earlier one), when newer than ``verdict``.
    """

    verdict: RunRecord | None = None
    blocked: RunRecord | None = None
    evidence: RunRecord | None = None
    count: int = 0

    @property
    def shown(self) -> RunRecord | None:
        """The run to show as the phase's evidence: its verdict, else the evidence, else the
        newest blocked run."""
        return self.verdict or self.evidence or self.blocked

    def cause(self, status: str) -> RunRecord | None:
        """The run whose outcome a ``failed`` or ``blocked`` status reads as: the verdict when it
        did not pass, the newest blocked run for ``blocked``. ``None`` when no run agrees with
        the status: a passing verdict (its checkpoint refused, the phase re-opened) explains
        neither, and a failing one says nothing of what blocks."""
        verdict = self.verdict
        if status == "failed" and verdict is not None and verdict.meta.recorded and verdict.outcome != "PASS":
            return verdict
        if status == "blocked":
            return self.blocked
        return None


def phase_runs(scan: RunScan) -> dict[str, PhaseRuns]:
    """``PhaseRuns`` of every phase that has runs, from a scan (oldest first)."""
    found: dict[str, dict[str, RunRecord | None]] = {}
    counts: dict[str, int] = {}
    for run in scan.runs:
        if run.phase is None:
            continue
        slot = found.setdefault(run.phase, {"verdict": None, "blocked": None, "evidence": None})
        counts[run.phase] = counts.get(run.phase, 0) + 1
        if run.evidence:
            slot["evidence"] = run
        elif run.informative and not run.meta.recorded:
            continue  # an interrupted run: the plan never recorded it
        elif run.informative:
            slot["verdict"], slot["blocked"] = run, None
            if slot["evidence"] is not None:
                slot["evidence"] = None  # the phase's own verdict is newer than the evidence
        else:
            slot["blocked"] = run
    return {phase: PhaseRuns(count=counts[phase], **slot) for phase, slot in found.items()}
