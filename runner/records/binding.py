"""What binds results to the plan they were measured for, and the check that imported results fit.

Results travel (``runner gate --out`` on a GPU host, ``runner advance --results`` in the clone).
The tree fingerprint leaves the plan out, so on its own it would accept results from a copy whose
gate command was edited (``exit 1; ...`` removed): the gates that ran would not be the plan's.
So every phase's results carry the definitions of its gates as the run saw them (``definitions``:
everything that decides a verdict), and an import is refused unless they equal the plan's.

Decisions:

- A definition is what decides whether and how a gate's process runs and how its outcome is
  judged: ``kind``, ``run``, ``call``, ``args``, ``env``, ``requires``, ``timeout``, ``expect``,
  ``repeat``, ``confidence``. Results written before the last two existed carry neither; they
  read as the defaults (one run, 0.95), which is what those runs were.
  ``targets`` and ``tolerance`` are left out: they never change a verdict, and editing them must
  not make results measured on a GPU host unusable.
- Thresholds are also re-checked against the recorded metrics here, and the recorded target
  checks, and a passing gate's threshold checks, are replaced by the plan's: the runner trusts
  its own reading of the numbers only, so a check the plan does not have never reaches a
  checkpointed run's report. (A gate that did not pass keeps the checks it recorded: they say
  how it failed, and only a report that records no checkpoint shows them.)
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from runner.errors import ResultsError
from runner.plan.order import ordered_gates
from runner.plan.samples import DEFAULT_CONFIDENCE
from runner.plan.schema import Phase, Plan
from runner.records.checks import check_thresholds
from runner.records.results import GateResult, ResultsFile, plan_problems
from runner.timeutil import iso_time

VERDICT_FIELDS = ("kind", "run", "call", "args", "env", "requires", "timeout", "expect", "repeat", "confidence")
_ADDED_LATER = {"repeat": 1, "confidence": DEFAULT_CONFIDENCE}  # what a definition without them meant


def gate_definitions(phase: Phase) -> dict[str, dict[str, Any]]:
    """Each gate of ``phase`` by name: the fields that decide its verdict, as JSON values."""
    return {
        gate.name: gate.model_dump(mode="json", include=set(VERDICT_FIELDS))
        for gate in phase.gates
    }


def definition_problems(recorded: dict[str, dict[str, Any]] | None, phase: Phase) -> list[str]:
    """How the gate definitions ``recorded`` with some results differ from ``phase``'s in the plan."""
    if recorded is None:
        return ["the results carry no gate definitions (an older runner wrote them), so nothing "
                "shows they ran the plan's gates: run the gates again with this runner"]
    problems = []
    planned = gate_definitions(phase)
    for name, definition in planned.items():
        other = recorded.get(name)
        if other is None:
            continue  # a missing gate is reported by the caller
        for field in VERDICT_FIELDS:
            if other.get(field, _ADDED_LATER.get(field)) != definition.get(field):
                problems.append(
                    f"gate {name!r}: {field} differs (results: {_short(other.get(field))}, "
                    f"plan: {_short(definition.get(field))})"
                )
    return problems


def load_matching_results(
    plan: Plan, phase: Phase, path: Path, fingerprint: str, *, evidence: bool = False
) -> ResultsFile:
    """Load ``path`` and check it fits: plan, phase, tree, the phase's gate definitions, every
    gate of the phase present, and every threshold of a gate recorded PASS re-checked here.
    ``ResultsError`` names what differs. Gates recorded FAIL, ERROR, BLOCKED or SKIPPED are
    accepted as what they are: the phase is then recorded as failed or blocked, and only an
    all-PASS file checkpoints. The returned results hold the plan's target checks.
    (Several files, or one that covers only some gates: ``runner.records.combine``.)"""
    results = ResultsFile.load(Path(path))
    check_holds_phase(plan, phase, path, results, evidence=evidence)
    check_tree(path, results, fingerprint)
    refuse_problems(phase, path, results, evidence=evidence)
    return judged_here(results, phase)


def check_holds_phase(plan: Plan, phase: Phase, path: Path, results: ResultsFile, *, evidence: bool) -> None:
    """``ResultsError`` unless ``results`` (from ``path``) are for ``plan`` and hold ``phase``."""
    where = f"{path}:"
    if results.plan_id != plan.id:
        raise ResultsError(f"{where} results are for plan {results.plan_id!r}, not {plan.id!r}")
    held = [phase_results.phase for phase_results in results.phases]
    if phase.id not in held:
        what = "the phase named" if evidence else "the next phase to advance"
        hint = ""
        later = [p.id for p in plan.phases if p.id in held and p.status != "complete"]
        if not evidence and later:
            hint = (f"; to keep them as evidence for {later[0]} while it waits, run "
                    f"`runner advance --evidence --results {path}`")
        raise ResultsError(
            f"{where} results hold phase(s) {', '.join(held) or 'none'}, not {phase.id!r} ({what}){hint}"
        )


def check_tree(path: Path, results: ResultsFile, fingerprint: str) -> None:
    """``ResultsError`` unless ``results`` were measured on the tree ``fingerprint``."""
    if results.fingerprint != fingerprint:
        raise ResultsError(
            f"{path}: results were measured on tree {results.fingerprint}, but this tree is "
            f"{fingerprint}; run the gates again on this tree (or copy the same tree to the GPU host)"
        )


def refuse_problems(phase: Phase, path: Path, results: ResultsFile, *, evidence: bool) -> None:
    """``ResultsError`` naming ``path`` and everything ``file_problems`` finds."""
    problems = file_problems(phase, results)
    if problems:
        doing = "record evidence for" if evidence else "checkpoint"
        raise ResultsError(f"{path}: refusing to {doing} {phase.id}: " + "; ".join(problems))


def file_problems(phase: Phase, results: ResultsFile) -> list[str]:
    """What makes the results of ``phase`` in ``results`` unfit for the plan's phase: identity,
    gate definitions, artifacts named instead of carried, order, unexplained skips, a gate
    missing (one the file says it does not cover may be missing: another file holds it), and
    a threshold of a gate recorded PASS that does not hold."""
    phase_results = results.phase(phase.id)
    recorded = {gate.name: gate for gate in phase_results.gates}
    problems: list[str] = identity_problems(results)
    problems += definition_problems(phase_results.definitions, phase)
    problems += [f"gate {gate.name!r}: names artifact files instead of carrying their text (a run "
                 "folder's results.json, not one written by runner gate --out)"
                 for gate in phase_results.gates if gate.artifact_files]
    problems += plan_problems(phase_results.gates, ordered_gates(phase))
    problems += unexplained_skips(phase_results.gates)
    coverage = phase_results.coverage
    not_covered = set(coverage.not_covered) if coverage is not None else set()
    planned = {gate.name for gate in phase.gates}
    problems += [f"gate {name!r} is listed as not covered, but this phase has no such gate"
                 for name in sorted(not_covered - planned)]
    for gate in phase.gates:
        result = recorded.get(gate.name)
        if result is None:
            if gate.name not in not_covered:
                problems.append(f"gate {gate.name!r} is missing")
            continue
        if result.outcome != "PASS":
            continue
        for check in check_thresholds(gate.expect, result.metrics, gate.confidence):
            if not check.ok:
                problems.append(f"gate {gate.name!r}: {check.metric} {check.reason} (plan: {check.threshold})")
    return problems


def judged_here(results: ResultsFile, phase: Phase) -> ResultsFile:
    """``results`` with the gates of ``phase`` as the plan judges them (``_judged_here``)."""
    phase_results = results.phase(phase.id)
    gates = [_judged_here(gate, phase) for gate in phase_results.gates]
    phases = [p.model_copy(update={"gates": gates}) if p.phase == phase.id else p for p in results.phases]
    return results.model_copy(update={"phases": phases})


def _judged_here(gate: GateResult, phase: Phase) -> GateResult:
    """``gate`` with its targets, and for a PASS its threshold checks, as the plan's gate
    judges its recorded metrics (what a local run would have recorded)."""
    planned = phase.gate(gate.name)
    update = {"targets": check_thresholds(planned.targets, gate.metrics, planned.confidence)}
    if gate.outcome == "PASS":
        update["checks"] = check_thresholds(planned.expect, gate.metrics, planned.confidence)
    return gate.model_copy(update=update)


def identity_problems(results: ResultsFile) -> list[str]:
    """How the run id of ``results`` disagrees with what it names: a run id is the run's start
    time and the first 8 hex digits of its tree fingerprint (``runner.runs.new_run_id``), and
    ``created`` is that same moment, so a run id or time edited by hand shows."""
    problems = []
    stamp, _, digest = results.run_id.partition("-")
    tree = results.fingerprint.partition(":")[2][:8]
    if digest != tree:
        problems.append(f"run id {results.run_id} ends in {digest}, but a run of tree {results.fingerprint[:15]}... "
                        f"is named ...-{tree}")
    try:
        moment = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return [*problems, f"run id {results.run_id} does not start with a real UTC time"]
    if results.created != iso_time(moment):
        problems.append(f"created {results.created} is not the time of run id {results.run_id} ({iso_time(moment)})")
    return problems


def unexplained_skips(gates: list[GateResult]) -> list[str]:
    """The ``SKIPPED`` gates among ``gates`` (in run order) that no run could have skipped.

    A run skips a gate only after an earlier gate failed or errored, or, for a benchmark, after
    a verify gate did not pass (``runner.gates.execute.run_steps``); the plan has no way to let a
    gate be skipped otherwise. So a gate rewritten as ``SKIPPED`` cannot turn a failed phase
    into a pass: every gate the plan defines must pass for a checkpoint."""
    problems = []
    stopped = unverified = False
    for gate in gates:
        if gate.outcome == "SKIPPED" and not (stopped or (gate.kind == "benchmark" and unverified)):
            problems.append(
                f"gate {gate.name!r} is SKIPPED, but no gate before it failed or errored (nor, for a "
                "benchmark, a verify gate before it did not pass): a run skips a gate only then, and "
                "every gate of the plan must pass for a checkpoint; run the gates again"
            )
        stopped = stopped or gate.outcome in ("FAIL", "ERROR")
        unverified = unverified or (gate.kind == "verify" and gate.outcome != "PASS")
    return problems


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
