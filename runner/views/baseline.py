"""``runner gate --baseline``: the run a fresh check is judged against. Pure.

``refuse_unusable_baseline`` is called before any gate runs, so a baseline that cannot be
compared costs no gate time; ``compare_with_baseline`` is ``runner diff`` of the baseline and
the fresh results (``runner.views.diff``, the same verdicts).

Decisions:

- Only the same machine fingerprint is compared: a baseline from another machine is refused
  (exit 2), where ``runner diff`` of two such runs says "not comparable". A check asked to judge
  regressions that could only answer "not comparable" would report nothing while looking like
  it had.
- The baseline must hold a phase the check runs; its other phases are ignored.
"""

from __future__ import annotations

from pathlib import Path

from runner.errors import UsageError
from runner.formatting import short
from runner.plan.schema import Phase, Plan
from runner.records.machine import MachineInfo
from runner.records.results import ResultsFile
from runner.views.diff import MetricsDiff, diff_runs
from runner.views.runs import RunRecord, describe_machine


def refuse_unusable_baseline(baseline: RunRecord, label: str, machine: MachineInfo, phases: list[Phase]) -> None:
    """``UsageError`` saying what, where and how to fix when ``baseline`` cannot judge a check
    of ``phases`` on ``machine``."""
    held = [results.phase for results in baseline.phase_results()]
    if not {phase.id for phase in phases} & set(held):
        raise UsageError(
            f"--baseline {label}: run {baseline.run_id} holds phase {', '.join(held)}, none of the phases "
            f"checked here ({', '.join(phase.id for phase in phases)}); name a run of one of them "
            "(runner history PHASE lists them)"
        )
    if baseline.machine.fingerprint != machine.fingerprint:
        raise UsageError(
            f"--baseline {label}: run {baseline.run_id} was measured on {describe_machine(baseline.machine)} "
            f"(machine fingerprint {short(baseline.machine.fingerprint)}), this machine is "
            f"{describe_machine(machine)} ({short(machine.fingerprint)}); timings are compared only on the "
            "same machine fingerprint: name a run made on this machine (runner history shows each run's "
            "machine fp), or check without --baseline"
        )


def compare_with_baseline(plan: Plan, baseline: RunRecord, label: str, fresh: ResultsFile,
                          root: Path | None = None) -> MetricsDiff:
    """The diff of ``baseline`` (A) and the ``fresh`` results of this check (B)."""
    checked = {results.phase for results in fresh.phases}
    if baseline.phase is None and len(baseline.phase_results()) > 1:
        # a results file of several phases: compare only what was checked
        baseline = RunRecord(baseline.path, baseline.results.model_copy(update={"phases": [
            results for results in baseline.results.phases if results.phase in checked]}), None, baseline.meta)
    here = RunRecord(path=Path("this check") / "results.json", results=fresh)
    return diff_runs(plan, baseline, here, labels=(label, "this check"), root=root)
