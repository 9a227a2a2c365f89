"""``runner diff``: compare the metrics of two runs or checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from runner.cli._common import PLAN_HELP, domain_errors
from runner.errors import ExitCode, UsageError
from runner.plan.schema import DEFAULT_TOLERANCE
from runner.formatting import format_metric, json_text, one_line, table_cell, text_columns
from runner.views.diff import MetricDelta, MetricsDiff, diff_runs
from runner.views.history import resolve_run
from runner.workspace import open_workspace

SAMPLES_LEGEND = ("samples: median [interval of the median at the gate's confidence] n=count; p: two-sided "
                  "Mann-Whitney U, a change is significant below 1 - confidence")
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
    is a regression only beyond the gate's declared tolerance (10% where the plan declares
    none; the output says so), only when both runs have the
    same machine fingerprint (on different machines it is "not comparable") and, for a metric
    reported as samples, only when a Mann-Whitney U test finds the change significant at the
    gate's confidence (else "no significant change"; the medians are shown with their
    intervals). Where B stands against each target is shown beside it. Exits 1 when a
    regression is flagged.
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
    hidden = hidden_rows(result.rows, rows)
    text = _markdown(result, rows, hidden) if output_format == "markdown" else diff_text(result, rows, hidden)
    typer.echo(text)
    raise typer.Exit(int(code))


def hidden_rows(every: list[MetricDelta], shown: list[MetricDelta]) -> list[str]:
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
    regressions, defaulted = result.regressions, result.judged_by_default
    line = f"{len(regressions)} regression(s)" if regressions else "no regression"
    if defaulted:
        names = ", ".join(one_line(f"{row.gate}.{row.metric}") for row in defaulted[:5]) + (
            ", ..." if len(defaulted) > 5 else "")
        line += (f"; judged against the default tolerance of {DEFAULT_TOLERANCE * 100:g}% (the plan "
                 f"declares no tolerance: for them): {names}")
    return line


def diff_text(result: MetricsDiff, rows: list[MetricDelta], hidden: list[str]) -> str:
    """The diff as text: both runs, the table of ``rows``, what was left out, the verdict."""
    lines = [f"A: {result.old.title}", f"B: {result.new.title}", result.note, ""]
    if rows:
        table = [("phase", "gate", "metric", "old", "new", "delta", "delta %", "p", "tolerance", "target (B)",
                  "verdict")]
        table += [_cells(row) for row in rows]
        lines += text_columns(table)
    else:
        lines.append("no metric changed")
    if hidden:
        lines.append(f"(not shown: {'; '.join(hidden)}; --all shows them)")
    if any(row.confidence is not None for row in rows):
        lines.append(SAMPLES_LEGEND)
    lines += ["", _verdict_line(result)]
    return "\n".join(lines)


def _cells(row: MetricDelta) -> tuple[str, ...]:
    delta = "-" if row.delta is None else f"{row.delta:+.4g}"
    pct = "-" if row.delta_pct is None else f"{row.delta_pct:+.1f}%"
    p_value = "-" if row.p_value is None else format(row.p_value, ".2g")
    tolerance = "-" if row.tolerance is None else f"{row.tolerance * 100:g}%"
    if row.tolerance_default:
        tolerance += " (default)"
    return (one_line(row.phase), one_line(row.gate), one_line(row.metric),
            _value(row.old, row.old_samples, row.old_interval), _value(row.new, row.new_samples, row.new_interval),
            delta, pct, p_value, tolerance, _target(row), row.verdict)


def _value(value: object, samples: int | None, interval: list[float] | None) -> str:
    """``2.31``, or for samples their median and interval: ``2.31 [2.1, 2.5] n=20``
    (``2.31 n=3`` when they are too few for an interval)."""
    if value is None:
        return "-"
    text = format_metric(value)
    if samples is None:
        return text
    if interval is not None:
        text += f" [{format_metric(interval[0])}, {format_metric(interval[1])}]"
    return f"{text} n={samples}"


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
        lines += ["| phase | gate | metric | A | B | delta | delta % | p | threshold | target (B) | verdict |",
                  "|---|---|---|--:|--:|--:|--:|--:|---|---|---|"]
        for row in rows:
            cells = _cells(row)
            verdict = f"**{row.verdict}**" if row.verdict == "regression" else row.verdict
            lines.append("| " + " | ".join(table_cell(c) for c in (*cells[:8], row.threshold or "-", cells[9]))
                         + f" | {verdict} |")
    else:
        lines.append("No metric changed.")
    if hidden:
        lines += ["", f"Not shown: {'; '.join(hidden)}."]
    if any(row.confidence is not None for row in rows):
        lines += ["", SAMPLES_LEGEND]
    return "\n".join(lines)
