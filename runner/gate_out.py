"""``runner gate --out FILE``: the results file, written after each gate, and what ``--only`` covers.

A job on a shared GPU host has a time limit, and a job that dies at minute 9 used to lose every
gate it had finished. So the file is written as the run goes: ``ResultsOut.add`` rewrites it
after every gate, and the next job runs the rest with ``--only`` (``runner.records.combine``
imports the files together).

Decisions:

- Every write is atomic (``runner.atomic``: a temp file, fsync, rename): whenever the job ends,
  SIGKILL included, FILE is the last complete version, valid JSON of the gates finished so
  far. While the run goes on, each phase that has not finished carries ``coverage`` with
  ``finished: false``: its finished gates as covered, the rest as not covered.
- A gate still running when the job ends is in no version: only a gate's result is written, and
  a result exists once the gate is over. An interrupt (SIGINT, SIGTERM) ends the running gate
  and writes nothing more.
- Before each write the tree is fingerprinted again (a few tens of milliseconds): a gate that
  changed the tree stops the writing, so FILE keeps only gates that ran on the tree whose
  fingerprint it carries. A run whose first gate changed the tree writes nothing, as before.
- The first write replaces what FILE held (an earlier job's file of the same name); a job that
  ends before its first gate finishes leaves it as it was.
- A phase run with ``--only`` keeps its ``coverage`` (``only``, ``finished: true``) in the
  final file; a phase all of whose gates ran has none, so the file reads as it always did.
- A disk that refuses a write mid-run does not stop the gates; the next gate tries again, an
  interrupted run names the refusal, and the final write turns a refusal into ``ReportError``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path

from runner.errors import ReportError, UsageError
from runner.plan.order import ordered_gates
from runner.plan.schema import Phase
from runner.records.binding import gate_definitions
from runner.records.results import Coverage, GateResult, PhaseResults, ResultsFile
from runner.records.run_folder import REPORTS_DIR
from runner.runs import RunContext
from runner.workspace import Workspace


def phase_record(phase: Phase, gates: list[GateResult], only: Collection[str] | None, *,
                 finished: bool = True) -> PhaseResults:
    """The results of ``phase`` from ``gates``, with the ``coverage`` they need: none when every
    gate of the phase is there and the run finished, else which gates they hold and which not."""
    names = [gate.name for gate in gates]
    every = [gate.name for gate in ordered_gates(phase)]
    selected = [name for name in every if only is None or name in only]
    coverage = None
    if not finished or selected != every:
        coverage = Coverage(covered=names, not_covered=[name for name in every if name not in names],
                            only=None if selected == every else selected, finished=finished)
    return PhaseResults(phase=phase.id, gates=gates, definitions=gate_definitions(phase), coverage=coverage)


def select_gates(phases: Sequence[Phase], only: Sequence[str]) -> dict[str, frozenset[str] | None]:
    """Per phase id, the gates ``--only`` selects of it (``None``: every gate, no ``--only``);
    ``only`` holds names or comma lists of them. ``UsageError`` for a name no phase named has,
    or a phase named that has none of the names."""
    if not only:
        return {phase.id: None for phase in phases}
    names = list(dict.fromkeys(name.strip() for item in only for name in item.split(",") if name.strip()))
    listing = "; ".join(f"{phase.id}: {', '.join(gate.name for gate in ordered_gates(phase))}" for phase in phases)
    if not names:
        raise UsageError(f"--only takes GATE[,GATE...], names of gates of the phases named ({listing})")
    unknown = [name for name in names if all(name not in {gate.name for gate in phase.gates} for phase in phases)]
    if unknown:
        raise UsageError(f"--only names {', '.join(unknown)}, which no phase checked here has (gates: {listing})")
    chosen = {}
    for phase in phases:
        picked = frozenset(name for name in names if name in {gate.name for gate in phase.gates})
        if not picked:
            raise UsageError(f"phase {phase.id} has none of the gates --only names ({', '.join(names)}); name "
                             f"only the phases whose gates you run (gates: {listing})")
        chosen[phase.id] = picked
    return chosen


def unverified_note(phase: Phase, only: Collection[str] | None) -> str | None:
    """What to know when ``--only`` runs a benchmark of ``phase`` without its verify gates."""
    if only is None:
        return None
    benchmarks = [gate.name for gate in phase.gates if gate.kind == "benchmark" and gate.name in only]
    verify = [gate.name for gate in phase.gates if gate.kind == "verify" and gate.name not in only]
    if not benchmarks or not verify:
        return None
    return (f"{phase.id}: benchmark {', '.join(benchmarks)} runs without the phase's verify gate(s) "
            f"{', '.join(verify)}; it counts only where they pass in a results file imported with this one "
            f"(runner advance --results THIS --results OTHER)")


class ResultsOut:
    """FILE as the run goes (see the module docstring)."""

    def __init__(self, ws: Workspace, path: Path, run: RunContext, fingerprint: str, own_files: Sequence[Path]):
        self.ws, self.path, self.run = ws, Path(path), run
        self.fingerprint, self.own_files = fingerprint, list(own_files)
        self.done: list[PhaseResults] = []
        self.phase: Phase | None = None
        self.only: Collection[str] | None = None
        self.gates: list[GateResult] = []
        self.written = 0  # gates in FILE
        self.changed_at: str | None = None  # the gate after which the tree was found changed
        self.problem: str | None = None

    def start(self, phase: Phase, only: Collection[str] | None) -> None:
        """A phase's gates are about to run."""
        self.phase, self.only, self.gates = phase, only, []

    def add(self, result: GateResult) -> None:
        """A gate of the current phase finished: write FILE with it, if the tree is unchanged."""
        self.gates.append(result)
        if self.changed_at is not None:
            return
        if self.ws.fingerprint(self.own_files) != self.fingerprint:
            self.changed_at = result.name
            return
        partial = phase_record(self.phase, list(self.gates), self.only, finished=False)
        self._write([*self.done, partial])

    def end(self, results: PhaseResults) -> None:
        """The current phase finished with ``results``."""
        self.done.append(results)
        self.phase, self.gates = None, []

    def finish(self, results: ResultsFile) -> None:
        """The run is over and the tree did not change: FILE becomes ``results``."""
        try:
            results.dump(self.path)
        except OSError as exc:
            raise ReportError(f"cannot write --out {self.path}: {exc.strerror or exc}") from None
        self.written = sum(len(phase.gates) for phase in results.phases)

    def kept(self) -> str:
        """What FILE holds after a run that did not finish it, in words (with the last write's
        refusal, if the disk refused it)."""
        refused = f" ({self.problem})" if self.problem else ""
        if not self.written:
            return f"{self.path} was not written{refused}"
        return f"{self.path}{refused} keeps the {self.written} gate(s) that finished before"

    def counted_note(self) -> str | None:
        """A warning when FILE lies in the tree where the fingerprint counts it: a next job in
        this copy of the tree would then run on another tree, whose results do not combine."""
        try:
            rel = self.path.resolve().relative_to(self.ws.root.resolve()).as_posix()
        except (ValueError, OSError):
            return None
        if rel not in self.ws.tree_state().files:
            return None
        return (f"note: {self.path} lies in the tree, where the fingerprint counts it: a next job in this copy "
                "would run on another tree, and its results would not combine with these; write the results "
                f"files of one phase outside the tree, under {REPORTS_DIR}/, or in a folder .gitignore ignores")

    def _write(self, phases: list[PhaseResults]) -> None:
        try:
            self.run.results(self.ws, phases).dump(self.path)
        except OSError as exc:
            self.problem = f"cannot write {self.path}: {exc.strerror or exc}"
            return
        self.problem = None
        self.written = sum(len(phase.gates) for phase in phases)
