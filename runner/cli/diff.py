"""``runner diff``: compare the metrics of two runs or checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from runner.cli._common import PLAN_HELP, domain_errors
from runner.errors import ExitCode, UsageError
from runner.formatting import format_metric, json_text, table_cell, text_columns
from runner.views.history import resolve_run
from runner.views.diff import MetricDelta, diff_runs
from runner.workspace import open_workspace

REF_HELP = "A run id (or its start), a results.json or run folder path, or a PLAN/PHASE checkpoint tag."


def diff(
    old: Annotated[str, typer.Argument(help=f"The baseline. {REF_HELP}", metavar="A")],
    new: Annotated[str, typer.Argument(help=f"The run to judge. {REF_HELP}", metavar="B")],
    plan: Annotated[Path | None, typer.Option("--plan", metavar="FILE", help=PLAN_HELP)] = None,
    show_all: Annotated[
        bool,
        typer.Option("--all", help="List every metric (default: metrics with a threshold, and real changes)."),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
    output_format: Annotated[
        str,
        typer.Option("--format", metavar="text|markdown",
                     help="text (default) or markdown: a table for a pull-request comment."),
    ] = "text",
) -> None:
    """Compare the metrics of run A (baseline) and run B: old, new, delta and delta % per metric.

    A change for the worse (direction from the metric's threshold in the plan) is a regression
    only beyond the gate's declared tolerance and only when both runs have the same machine
    fingerprint; on different machines it is "not comparable". Exits 1 when a regression is
    flagged.
    """
    with domain_errors():
        if output_format not in ("text", "markdown"):
            raise UsageError(f"--format is text or markdown, not {output_format!r}")
        ws = open_workspace(plan)
        result = diff_runs(ws.plan, resolve_run(ws, old), resolve_run(ws, new), labels=(old, new), root=ws.root)
    code = ExitCode.GATE_FAILED if result.regressions else ExitCode.OK
    if as_json:
        typer.echo(json_text(result.to_json()))
        raise typer.Exit(int(code))
    rows = [row for row in result.rows if show_all or row.notable]
    hidden = len(result.rows) - len(rows)
    if output_format == "markdown":
        typer.echo(_markdown(result, rows, hidden))
        raise typer.Exit(int(code))
    lines = [
        f"A: {result.old.title}",
        f"B: {result.new.title}",
        result.note,
        "",
    ]
    if rows:
        table = [("phase", "gate", "metric", "old", "new", "delta", "delta %", "tolerance", "verdict")]
        table += [_cells(row) for row in rows]
        lines += text_columns(table)
    else:
        lines.append("no metric changed")
    if hidden:
        lines.append(f"({hidden} metric(s) without a threshold and without a real change not shown; --all shows them)")
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


def _markdown(result, rows: list[MetricDelta], hidden: int) -> str:
    """The diff as Markdown for a pull-request comment."""
    regressions = len(result.regressions)
    lines = [
        f"**runner diff**: {regressions} regression(s)" if regressions else "**runner diff**: no regression",
        "",
        f"- A: `{result.old.run_id}` ({table_cell(result.old.title.split(' ', 1)[1])})",
        f"- B: `{result.new.run_id}` ({table_cell(result.new.title.split(' ', 1)[1])})",
        f"- {result.note}",
        "",
    ]
    if rows:
        lines += ["| phase | gate | metric | A | B | delta | delta % | threshold | verdict |",
                  "|---|---|---|--:|--:|--:|--:|---|---|"]
        for row in rows:
            cells = _cells(row)
            verdict = f"**{row.verdict}**" if row.verdict == "regression" else row.verdict
            lines.append("| " + " | ".join(table_cell(c) for c in (*cells[:7], row.threshold or "-")) + f" | {verdict} |")
    else:
        lines.append("No metric changed.")
    if hidden:
        lines += ["", f"{hidden} metric(s) without a threshold and without a real change not shown."]
    return "\n".join(lines)
