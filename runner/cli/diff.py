"""``runner diff``: compare the metrics of two runs or checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from runner.cli._common import PLAN_HELP, domain_errors
from runner.errors import ExitCode
from runner.formatting import format_metric, text_columns
from runner.history import resolve_run
from runner.metrics_diff import MetricDelta, diff_runs
from runner.workspace import open_workspace

REF_HELP = "A run id (or its start), a results.json or run folder path, or a PLAN/PHASE checkpoint tag."


def diff(
    old: Annotated[str, typer.Argument(help=f"The baseline. {REF_HELP}", metavar="A")],
    new: Annotated[str, typer.Argument(help=f"The run to judge. {REF_HELP}", metavar="B")],
    plan: Annotated[Path | None, typer.Option("--plan", help=PLAN_HELP)] = None,
    show_all: Annotated[bool, typer.Option("--all", help="Also list metrics that did not change.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Compare the metrics of run A (baseline) and run B: old, new, delta and delta % per metric.

    A change for the worse (direction from the metric's threshold in the plan) is a regression
    only beyond the gate's declared tolerance and only when both runs have the same machine
    fingerprint; on different machines it is "not comparable". Exits 1 when a regression is
    flagged.
    """
    with domain_errors():
        ws = open_workspace(plan)
        result = diff_runs(ws.plan, resolve_run(ws, old), resolve_run(ws, new), labels=(old, new), root=ws.root)
    code = ExitCode.GATE_FAILED if result.regressions else ExitCode.OK
    if as_json:
        typer.echo(json.dumps(result.to_json(), indent=2))
        raise typer.Exit(int(code))
    lines = [
        f"A: {result.old.run_id} ({result.old.time}, {result.old.machine})",
        f"B: {result.new.run_id} ({result.new.time}, {result.new.machine})",
        result.note,
        "",
    ]
    rows = [row for row in result.rows if show_all or row.verdict != "unchanged"]
    if rows:
        table = [("phase", "gate", "metric", "old", "new", "delta", "delta %", "tolerance", "verdict")]
        table += [_cells(row) for row in rows]
        lines += text_columns(table)
    else:
        lines.append("no metric changed")
    regressions = len(result.regressions)
    lines += ["", f"{regressions} regression(s)" if regressions else "no regression"]
    typer.echo("\n".join(lines))
    raise typer.Exit(int(code))


def _cells(row: MetricDelta) -> tuple[str, ...]:
    def value(v: object) -> str:
        return "-" if v is None else format_metric(v)

    delta = "-" if row.delta is None else f"{row.delta:+.4g}"
    pct = "-" if row.delta_pct is None else f"{row.delta_pct:+.1f}%"
    tolerance = "-" if row.tolerance is None else f"{row.tolerance * 100:g}%"
    return (row.phase, row.gate, row.metric, value(row.old), value(row.new), delta, pct, tolerance, row.verdict)
