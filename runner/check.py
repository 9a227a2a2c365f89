"""``runner gate``: run phases' gates as a read-only check.

The check changes no file except the ``--out`` results file and the ``--logs`` folder (when
given; otherwise the logs go to a fresh folder under the system's temporary folder, named to
the user through ``on_logs`` and in the messages, and kept), makes no commit and takes no lock, so it can run in CI and on a GPU host that holds
a plain copy of the tree (no ``.git``).

``--only GATE,...`` runs those gates of the named phases alone, so a phase whose gates do not
fit one job runs in several; ``--out`` is written after each gate (``runner.gate_out``), so a
job cut short keeps what it finished. ``runner advance --results A --results B`` combines them.

Decisions:

- ``--only`` names gates of the phases named (``--completed`` is refused with it: which gates of
  which phases would be a guess). Every name must be a gate of one of them, and every phase
  named must have one of the names, else a ``UsageError`` lists the gates.
- A benchmark selected without its phase's verify gates still runs: they may run in another
  job. DESIGN's "a benchmark runs only after its phase's verify gate passed in the same run"
  becomes, for split runs, "... passed in one of the files imported with it", which
  ``runner.records.combine`` holds at import; ``runner gate`` says so when it runs one alone.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from runner.errors import ExitCode, UsageError
from runner.gate_out import ResultsOut, phase_record, select_gates, unverified_note
from runner.gates.execute import ProgressFn
from runner.gates.preflight import check_calls
from runner.gates.requirements import found_modules
from runner.plan.order import ordered_gates, plan_run
from runner.plan.schema import Phase, Plan
from runner.records import machine as machine_probe
from runner.records.machine import MachineInfo
from runner.records.places import check_outputs
from runner.records.results import GateResult, PhaseResults, ResultsFile, combine_outcomes
from runner.runs import PhaseStartFn, ResultFn, RunContext, exit_code_for, finish_elsewhere_hint, run_phase
from runner.views.baseline import compare_with_baseline, refuse_unusable_baseline
from runner.views.diff import MetricsDiff
from runner.views.junit import append_summary, write_empty_junit, write_junit
from runner.views.runs import RunRecord
from runner.workspace import Workspace


# --- runner gate --------------------------------------------------------------------------------


@dataclass
class GateCheck:
    """What ``runner gate`` did: the results, the exit code and lines to show the user."""

    results: ResultsFile | None
    exit_code: ExitCode
    messages: list[str] = field(default_factory=list)
    baseline: MetricsDiff | None = None


class ChecksInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM while the gates ran; ``messages`` say what ``--out`` kept."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("interrupted")
        self.messages = messages


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
    on_start: PhaseStartFn | None = None,
    on_logs: Callable[[Path], None] | None = None,
    baseline: RunRecord | None = None,
    baseline_label: str = "baseline",
    only: Sequence[str] = (),
) -> GateCheck:
    """Run the gates of the selected phases; write ``out`` when given. Changes nothing else.

    ``junit`` (JUnit XML) and ``summary`` (Markdown, appended) are written for CI whenever the
    gates ran, also when the tree changed under them; like ``out`` and ``logs`` they are left
    out of the tree fingerprint. With a ``baseline`` run (from this machine fingerprint, else
    refused before any gate), the results are compared with it as ``runner diff`` compares two
    runs, and a regression makes the exit code 1 even when every gate passed. ``only`` names
    the gates to run (``select_gates``); ``out`` is written after each gate (``ResultsOut``). An
    interrupt raises ``ChecksInterrupted`` saying what ``out`` kept.
    """
    check_outputs(files={"--out": out, "--junit": junit, "--summary": summary}, folders={"--logs": logs})
    if only and completed:
        raise UsageError("--only picks gates of the phases you name; name them instead of --completed")
    phases = select_phases(ws.plan, phase_ids, completed)
    selection = select_gates(phases, only)
    if not phases:
        messages = ["no phase is complete yet; nothing to check"]
        if junit is not None:  # CI that expects the file finds one, counting zero tests
            write_empty_junit(Path(junit), ws.plan.id)
            messages.append(f"JUnit XML (no test) written to {junit}")
        return GateCheck(None, ExitCode.OK, messages)
    for phase in phases:  # a misnamed `call` is a plan error before any gate runs
        check_calls(ws.doc, phase, ws.root)
    machine = machine or machine_probe.probe_machine()
    if baseline is not None:
        refuse_unusable_baseline(baseline, baseline_label, machine, phases)
    devices = frozenset(machine.devices)
    own_files = [Path(path) for path in (out, logs, junit, summary) if path is not None]
    fingerprint = ws.fingerprint(own_files)
    run = RunContext.start(fingerprint, machine)
    phase_results: list[PhaseResults] = []
    messages: list[str] = [note for phase in phases if (note := unverified_note(phase, selection[phase.id]))]
    writer = ResultsOut(ws, Path(out), run, fingerprint, own_files) if out is not None else None
    # the logs stay where the user can read them: --logs, else a fresh folder under the temp dir
    log_root = Path(logs) if logs is not None else Path(tempfile.mkdtemp(prefix="runner-gate-logs-"))
    log_root.mkdir(parents=True, exist_ok=True)
    if on_logs is not None:
        on_logs(log_root)
    for phase in phases:
        only_here = selection[phase.id]
        steps = plan_run(phase, devices, found_modules(phase, ws.root), only=only_here)

        def finished(phase_id: str, result: GateResult) -> None:
            if writer is not None:
                writer.add(result)
            if on_result is not None:
                on_result(phase_id, result)

        if writer is not None:
            writer.start(phase, only_here)
        try:
            gates = run_phase(ws, phase, steps, log_dir=log_root / phase.id, report_dir=log_root,
                              on_result=finished, on_progress=on_progress, keep_going=keep_going, on_start=on_start)
        except KeyboardInterrupt:
            raise ChecksInterrupted(_interrupted(writer, phase, log_root)) from None
        results = phase_record(phase, gates, only_here)
        if writer is not None:
            writer.end(results)
        phase_results.append(results)
        if results.outcome == "BLOCKED":
            messages.append(f"{phase.id}: blocked; {finish_elsewhere_hint(phase, steps)}")
    outcome = combine_outcomes(results.outcome for results in phase_results)
    exit_code = exit_code_for(outcome)
    results_file = run.results(ws, phase_results)
    messages += _write_ci_files(results_file, junit=junit, summary=summary)
    if ws.fingerprint(own_files) != fingerprint:
        kept = ""
        if writer is not None:
            kept = f"; {writer.kept()} it changed" if writer.written else "; the results file was not written"
        messages.append("the tree changed while the gates ran, so these results describe no single tree" + kept)
        messages.append(f"gate logs in {log_root}")
        return GateCheck(results_file, ExitCode.GATE_FAILED, messages)
    if writer is not None:
        writer.finish(results_file)
        messages.append(f"results written to {out}" + _coverage_text(results_file, out))
        if any(phase.coverage is not None for phase in results_file.phases):
            messages += [note for note in [writer.counted_note()] if note]
    messages.append(f"gate logs in {log_root}")
    compared = None
    if baseline is not None:
        compared = compare_with_baseline(ws.plan, baseline, baseline_label, results_file, ws.root)
        if compared.regressions and exit_code in (ExitCode.OK, ExitCode.BLOCKED):
            exit_code = ExitCode.GATE_FAILED
    return GateCheck(results_file, exit_code, messages, compared)


def _interrupted(writer: ResultsOut | None, phase: Phase, log_root: Path) -> list[str]:
    """What an interrupted check tells the user: what ``--out`` kept, and how to run the rest."""
    lines = [f"gate logs in {log_root}"]
    if writer is None:
        return lines
    lines.insert(0, f"interrupted: {writer.kept()} the interrupt" if writer.written
                 else f"interrupted: {writer.path} was not written (no gate had finished)")
    rest = [gate.name for gate in ordered_gates(phase) if gate.name not in {g.name for g in writer.gates}
            and (writer.only is None or gate.name in writer.only)]
    if writer.written and rest:
        lines.insert(1, f"run the rest in another job: runner gate {phase.id} --only {','.join(rest)} "
                        f"--out OTHER.json, then runner advance --results {writer.path} --results OTHER.json")
        lines += [note for note in [writer.counted_note()] if note]
    return lines


def _coverage_text(results: ResultsFile, out: Path) -> str:
    """`` (alpha covers build, check; not covered: bench: ...)`` for a file of some gates only."""
    parts = [f"{phase.phase} covers {', '.join(phase.coverage.covered)}; not covered: "
             f"{', '.join(phase.coverage.not_covered)}"
             for phase in results.phases if phase.coverage is not None]
    if not parts:
        return ""
    return (f" ({'; '.join(parts)}); import it with the files of the other gates: "
            f"runner advance --results {out} --results OTHER.json")


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
