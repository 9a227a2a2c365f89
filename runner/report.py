"""The evidence of a run: ``reports/<plan>/<phase>/<run-id>/``.

A run's folder holds ``results.json`` (the ``ResultsFile`` of the run), ``report.md`` (rendered
from ``runner/templates/report.md.j2``), the gate logs the run wrote there and the gates'
artifacts as ``<gate>-<name>``. ``report.md`` shows every ``*.md`` artifact inline under its
gate, so the benchmark table and the build summary read in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from runner.formatting import MARKDOWN_FILTERS, format_metric, table_cell
from runner.results import GateResult, ResultsFile
from runner.schema import Phase, Plan
from runner.templating import template_env
from runner.workspace import safe_name

TEMPLATE = "report.md.j2"


@dataclass(frozen=True)
class ReportContext:
    """What a report says beyond the results themselves.

    ``outcome`` is the run's verdict (it can be ``FAIL`` although every gate passed, when the
    tree changed under them); ``notes`` are sentences shown at the top; ``source`` says where
    the results came from; ``base`` is the commit the gates ran on (``None`` outside git).
    """

    plan: Plan
    phase: Phase
    outcome: str
    base: str | None = None
    source: str = "local run"
    notes: list[str] = field(default_factory=list)


def artifact_file_name(gate: str, name: str) -> str:
    return f"{safe_name(gate)}-{safe_name(name)}"


def write_report(run_dir: Path, results: ResultsFile, context: ReportContext) -> Path:
    """Write ``results.json``, the artifacts and ``report.md`` into ``run_dir``; return the
    path of ``report.md``."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    results.dump(run_dir / "results.json")
    for phase_results in results.phases:
        for gate in phase_results.gates:
            for name, text in gate.artifacts.items():
                _write_text(run_dir / artifact_file_name(gate.name, name), text)
    report = run_dir / "report.md"
    _write_text(report, render_report(results, context, run_dir=run_dir))
    return report


def render_report(results: ResultsFile, context: ReportContext, *, run_dir: Path | None = None) -> str:
    """The Markdown report of ``results`` for ``context.phase``."""
    phase_results = results.phase(context.phase.id)
    gates = [_gate_view(gate, run_dir) for gate in phase_results.gates]
    env = template_env(filters=MARKDOWN_FILTERS)
    text = env.get_template(TEMPLATE).render(
        plan=context.plan,
        phase=context.phase,
        outcome=context.outcome,
        base=context.base,
        source=context.source,
        notes=context.notes,
        results=results,
        machine=results.machine,
        machine_fingerprint=results.machine.fingerprint,
        gates=gates,
        headline=headline_metrics(context.phase, phase_results.gates),
    )
    return text.rstrip("\n") + "\n"


def headline_metrics(phase: Phase, gates: list[GateResult]) -> dict[str, bool | int | float | str]:
    """The phase's headline metrics as reported by its gates (first gate reporting wins).

    A metric no gate reported is left out: it is never recorded as 0.
    """
    found: dict[str, bool | int | float | str] = {}
    for name in phase.headline_metrics():
        for gate in gates:
            value = gate.metrics.get(name)
            if value is not None:
                found[name] = value
                break
    return found


@dataclass(frozen=True)
class _GateView:
    result: GateResult
    log_link: str | None
    inline: list[tuple[str, str]]  # (name, markdown) of *.md artifacts
    links: str  # Markdown links to every artifact's file next to report.md
    other_metrics: str  # metrics that no threshold checks, "name=value, ..."


def _gate_view(gate: GateResult, run_dir: Path | None) -> _GateView:
    log_link = None
    if gate.log and run_dir is not None and (run_dir / gate.log).is_file():
        log_link = gate.log
    inline = [(name, text.strip("\n")) for name, text in sorted(gate.artifacts.items()) if name.endswith(".md")]
    links = ", ".join(f"[{name}]({artifact_file_name(gate.name, name)})" for name in sorted(gate.artifacts))
    checked = {check.metric for check in gate.checks}
    other = ", ".join(
        f"{name}={table_cell(format_metric(value))}"
        for name, value in sorted(gate.metrics.items())
        if name not in checked
    )
    return _GateView(gate, log_link, inline, links, other)


def _write_text(path: Path, text: str) -> None:
    path.write_bytes(text.encode("utf-8"))
