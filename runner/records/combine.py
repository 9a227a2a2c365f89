"""One phase recorded from several results files: ``runner advance --results A --results B``.

A phase whose gates do not fit one job runs them in several (``runner gate PHASE --only GATE,...
--out FILE``; or a job cut short at its time limit leaves the gates it finished, and the next
job runs the rest with ``--only``). ``import_results`` checks each file as a one-file import is
checked (``runner.records.binding``), then ``combine_results`` makes the phase's record. Pure
but for reading the files.

Decisions:

- Every file must hold the phase, for this plan, measured on one tree: the tree of this clone.
  Two files of two trees are refused naming both, before either is compared with the clone.
- A gate is taken from the files whose run ran it (``PASS``, ``FAIL``, ``ERROR``). Two such
  results must agree on the outcome: ``FAIL`` in one file and ``PASS`` in another is refused,
  naming both files, because choosing one would be choosing the verdict. Results that agree
  are taken from the first file given, and a note says which files hold the gate.
- A gate that no file ran keeps what a file recorded of it (``BLOCKED``, ``SKIPPED``), as a
  one-file import does.
- A gate that no file holds is recorded ``BLOCKED``, "not covered by any results file", rather
  than refusing the import: a phase that fails anyway is then recorded honestly (``failed``),
  one whose covered gates all pass is ``blocked``, and neither is ever checkpointed. The
  message names the gates still to run.
- Correct before fast: a benchmark counts only when every verify gate of its phase passed in
  one of the files (the rule a single run keeps with "in the same run"; ``runner gate --only``
  lets a benchmark run alone, so this is where it is held). A benchmark result without that is
  recorded ``SKIPPED``, what a run with ``--keep-going`` records, with the reason; its numbers
  stay in its results file.
- The record's run id, time and machine are those of the newest file (the phase's evidence was
  complete then); ``sources`` lists every file with its run, machine and the gates taken from
  it, so the report shows the machine of each gate.
- One file that covers every gate (what ``runner gate --out`` writes when its run finishes) is
  imported exactly as it always was: no ``sources``, nothing combined.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from runner.errors import ResultsError, UsageError
from runner.formatting import one_line
from runner.plan.order import ordered_gates
from runner.plan.schema import Phase, Plan
from runner.records.binding import check_holds_phase, check_tree, judged_here, refuse_problems
from runner.records.results import GateResult, PhaseResults, ResultsFile, ResultsSource

RAN = ("PASS", "FAIL", "ERROR")
NOT_COVERED = "not covered by any results file"


@dataclass(frozen=True)
class Imported:
    """Results ready to record: ``results`` hold the phase (and, from one whole file, whatever
    else it held); ``notes`` say what combining did; ``missing`` names the gates no file held."""

    results: ResultsFile
    notes: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def import_results(plan: Plan, phase: Phase, paths: Sequence[Path], fingerprint: str, *,
                   evidence: bool = False) -> Imported:
    """Load ``paths`` and check each fits the plan's ``phase`` and this tree (``ResultsError``
    naming the file otherwise), then combine them (see the module docstring)."""
    paths = [Path(path) for path in paths]
    if not paths:
        raise UsageError("no results file given")
    seen: dict[str, Path] = {}
    for path in paths:
        real = os.path.realpath(path)
        if real in seen:
            raise UsageError(f"--results {path} names the same file as --results {seen[real]}; give each file once")
        seen[real] = path
    loaded = [(path, ResultsFile.load(path)) for path in paths]
    for path, results in loaded:
        check_holds_phase(plan, phase, path, results, evidence=evidence)
    first_path, first = loaded[0]
    for path, results in loaded[1:]:
        if results.fingerprint != first.fingerprint:
            raise ResultsError(
                f"{first_path} was measured on tree {first.fingerprint} and {path} on tree {results.fingerprint}: "
                "the results files of one phase must come from one tree; copy the same tree to every job (a "
                "results file an earlier job left inside the tree is part of the next job's tree: write them "
                "outside it, under reports/, or in a folder .gitignore ignores)"
            )
    for path, results in loaded:
        check_tree(path, results, fingerprint)
        refuse_problems(phase, path, results, evidence=evidence)
    if len(loaded) == 1 and first.phase(phase.id).coverage is None:
        return Imported(judged_here(first, phase))
    combined = combine_results(phase, list(zip(_labels(paths), (results for _, results in loaded))))
    return Imported(judged_here(combined.results, phase), combined.notes, combined.missing)


def combine_results(phase: Phase, parts: Sequence[tuple[str, ResultsFile]]) -> Imported:
    """The record of ``phase`` from ``parts`` (a label, usually the file name, and the results
    it holds; each already checked). ``ResultsError`` when two parts ran a gate to different
    outcomes."""
    held = [(label, results.phase(phase.id)) for label, results in parts]
    taken: dict[str, list[str]] = {label: [] for label, _ in held}
    gates: list[GateResult] = []
    notes: list[str] = []
    conflicts: list[str] = []
    missing: list[str] = []
    for spec in ordered_gates(phase):
        found = [(label, gate) for label, results in held for gate in results.gates if gate.name == spec.name]
        ran = [(label, gate) for label, gate in found if gate.outcome in RAN]
        if len({gate.outcome for _, gate in ran}) > 1:
            conflicts.append(f"gate {spec.name!r} is " + " and ".join(f"{gate.outcome} in {label}" for label, gate in ran))
            continue
        if len(ran) > 1:
            notes.append(f"Gate {spec.name} is {ran[0][1].outcome} in {_listing([label for label, _ in ran])}; "
                         f"this record keeps the result of {ran[0][0]}.")
        chosen = ran[0] if ran else (found[0] if found else None)
        if chosen is None:
            missing.append(spec.name)
            gates.append(GateResult.not_run(spec, "BLOCKED", f"{NOT_COVERED} ({_covering(phase, held)})"))
            continue
        taken[chosen[0]].append(spec.name)
        gates.append(chosen[1])
    if conflicts:
        raise ResultsError(
            f"refusing to combine the results of {phase.id}: " + "; ".join(conflicts)
            + ": a gate held by two files must have one outcome; import the file whose run you mean to record "
            "(or run the gate again and import that file alone with the others)"
        )
    gates = _verified_benchmarks(gates, missing, taken, notes)
    if missing:
        notes.append(
            f"Not covered by any results file: {', '.join(missing)}; the phase is not checkpointed. Run "
            f"`runner gate {phase.id} --only {','.join(missing)} --out FILE` where they can run, then import "
            "FILE with the others."
        )
    label_of_newest, newest = max(parts, key=lambda part: (part[1].created, part[1].run_id))
    sources = [
        ResultsSource(file=label, run_id=results.run_id, created=results.created, machine=results.machine,
                      gates=taken[label])
        for label, results in parts
    ]
    record = PhaseResults(phase=phase.id, gates=gates, definitions=newest.phase(phase.id).definitions,
                          sources=sources)
    notes.insert(0, f"Combined from {len(parts)} results file(s): " + "; ".join(
        f"{source.file} (run {source.run_id} on {source.machine.hostname}: "
        f"{', '.join(source.gates) or 'no gate taken'})" for source in sources) + f"; run id and time of {label_of_newest}.")
    return Imported(newest.model_copy(update={"phases": [record]}), notes, missing)


def _verified_benchmarks(gates: list[GateResult], missing: list[str], taken: dict[str, list[str]],
                         notes: list[str]) -> list[GateResult]:
    """``gates`` with every benchmark that ran recorded ``SKIPPED`` when a verify gate of the
    phase did not pass in any file (its source no longer names it)."""
    unverified = [gate for gate in gates if gate.kind == "verify" and gate.outcome != "PASS"]
    if not unverified:
        return gates
    why = ", ".join(f"{gate.name} ({'not covered' if gate.name in missing else gate.outcome})" for gate in unverified)
    reason = (f"not counted: verify gate(s) {why} did not pass in any results file, and a benchmark counts "
              "only after its phase's verify gates pass")
    kept = []
    for gate in gates:
        if gate.kind == "benchmark" and gate.outcome in RAN:
            notes.append(f"Benchmark {gate.name} ran ({gate.outcome}) but is {reason}; its results file keeps "
                         "what it measured.")
            for names in taken.values():
                if gate.name in names:
                    names.remove(gate.name)
            gate = GateResult.not_run(gate, "SKIPPED", reason)
        kept.append(gate)
    return kept


def _covering(phase: Phase, held: list[tuple[str, PhaseResults]]) -> str:
    """``a.json covers build, check; b.json covers bench``: what each file holds of ``phase``."""
    return "; ".join(f"{label} covers {', '.join(gate.name for gate in results.gates) or 'no gate'}"
                     for label, results in held)


def _listing(labels: list[str]) -> str:
    return ", ".join(labels[:-1]) + f" and {labels[-1]}" if len(labels) > 1 else labels[0]


def _labels(paths: list[Path]) -> list[str]:
    """Each file's name, or the path as given where two files share a name."""
    names = [path.name for path in paths]
    return [one_line(name if names.count(name) == 1 else str(path)) for name, path in zip(names, paths)]
