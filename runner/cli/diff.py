"""``runner diff``: compare the metrics of two runs or checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from runner.cli._common import PLAN_HELP, domain_errors
from runner.errors import ExitCode, UsageError
from runner.formatting import format_metric, json_text, one_line, table_cell, text_columns
from runner.views.diff import MetricDelta, MetricsDiff, diff_runs
from runner.views.history import resolve_run
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

    A change for the worse (direction from the metric's threshold in the plan, else its target)
    is a regression only beyond the gate's declared tolerance and only when both runs have the
    same machine fingerprint; on different machines it is "not comparable". Where B stands
    against each target is shown beside it. Exits 1 when a regression is flagged.
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
    hidden = _hidden(result.rows, rows)
    text = _markdown(result, rows, hidden) if output_format == "markdown" else _text(result, rows, hidden)
    typer.echo(text)
    raise typer.Exit(int(code))


def _hidden(every: list[MetricDelta], shown: list[MetricDelta]) -> list[str]:
    """What the default view leaves out, one sentence per kind (``--all`` shows it)."""
    left = [row for row in every if row not in shown]
    counts = {kind: sum(row.verdict in verdicts for row in left) for kind, verdicts in (
        ("not run", ("not run",)), ("one run", ("added", "removed")))}
    quiet = len(left) - sum(counts.values())
    notes = []
    if counts["not run"]:
        notes.append(f"{counts['not run']} metric(s) of gates that did not run in one of the runs (blocked or skipped)")
    if counts["one run"]:
        notes.append(f"{counts['one run']} metric(s) without a threshold or target that only one run reports")
    if quiet:
        notes.append(f"{quiet} metric(s) without a threshold or target and without a real change")
    return notes


def _verdict_line(result: MetricsDiff) -> str:
    regressions, worse = result.regressions, result.worse_untolerated
    line = f"{len(regressions)} regression(s)" if regressions else "no regression"
    if worse:
        names = ", ".join(one_line(f"{row.gate}.{row.metric}") for row in worse[:5]) + (", ..." if len(worse) > 5 else "")
        line += f"; {len(worse)} metric(s) worse with no tolerance declared, so not judged: {names}"
    return line


def _text(result: MetricsDiff, rows: list[MetricDelta], hidden: list[str]) -> str:
    lines = [f"A: {result.old.title}", f"B: {result.new.title}", result.note, ""]
    if rows:
        table = [("phase", "gate", "metric", "old", "new", "delta", "delta %", "tolerance", "target (B)", "verdict")]
        table += [_cells(row) for row in rows]
        lines += text_columns(table)
    else:
        lines.append("no metric changed")
    if hidden:
        lines.append(f"(not shown: {'; '.join(hidden)}; --all shows them)")
    lines += ["", _verdict_line(result)]
    return "\n".join(lines)


def _cells(row: MetricDelta) -> tuple[str, ...]:
    def value(v: object) -> str:
        return "-" if v is None else format_metric(v)

    delta = "-" if row.delta is None else f"{row.delta:+.4g}"
    pct = "-" if row.delta_pct is None else f"{row.delta_pct:+.1f}%"
    tolerance = "-" if row.tolerance is None else f"{row.tolerance * 100:g}%"
    return (one_line(row.phase), one_line(row.gate), one_line(row.metric), value(row.old), value(row.new),
            delta, pct, tolerance, _target(row), row.verdict)


def _target(row: MetricDelta) -> str:
    """``>= 0.80 met`` or ``>= 0.80, 0.17 short`` for the new value; ``-`` without a target."""
    if row.target is None:
        return "-"
    if row.target_met:
        return f"{row.target} met"
    return f"{row.target}, {format_metric(row.target_gap)} short" if row.target_gap is not None else f"{row.target}, not met"


def _markdown(result: MetricsDiff, rows: list[MetricDelta], hidden: list[str]) -> str:
    """The diff as Markdown for a pull-request comment."""
    lines = [
        f"**runner diff**: {_verdict_line(result)}",
        "",
        f"- A: `{result.old.run_id}` ({table_cell(result.old.detail)})",
        f"- B: `{result.new.run_id}` ({table_cell(result.new.detail)})",
        f"- {result.note}",
        "",
    ]
    if rows:
        lines += ["| phase | gate | metric | A | B | delta | delta % | threshold | target (B) | verdict |",
                  "|---|---|---|--:|--:|--:|--:|---|---|---|"]
        for row in rows:
            cells = _cells(row)
            verdict = f"**{row.verdict}**" if row.verdict == "regression" else row.verdict
            lines.append("| " + " | ".join(table_cell(c) for c in (*cells[:7], row.threshold or "-", cells[8]))
                         + f" | {verdict} |")
    else:
        lines.append("No metric changed.")
    if hidden:
        lines += ["", f"Not shown: {'; '.join(hidden)}."]
    return "\n".join(lines)
