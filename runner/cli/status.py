"""``runner status``: show every phase, its last checkpoint and which phase is next."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from runner.cli._common import PLAN_HELP, domain_errors, stdout_console
from runner.formatting import format_metric
from runner.status import StatusView, plan_status
from runner.workspace import open_workspace


def status(
    plan: Annotated[Path | None, typer.Option("--plan", help=PLAN_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Show each phase's status, last checkpoint and headline metrics, and the next phase."""
    with domain_errors():
        view = plan_status(open_workspace(plan))
    if as_json:
        typer.echo(json.dumps(view.to_json(), indent=2))
        return
    console = stdout_console()
    if console.is_terminal:
        console.print(_table(view))
    else:
        typer.echo(_plain(view))


def _metrics(metrics: dict) -> str:
    return ", ".join(f"{name}={format_metric(value)}" for name, value in metrics.items())


def _table(view: StatusView) -> Table:
    table = Table(title=f"{view.plan_id}: {view.plan_title}" if view.plan_title else view.plan_id)
    for column in ("", "phase", "status", "checkpoint", "time", "commit", "headline metrics"):
        table.add_column(column)
    for phase in view.phases:
        record = phase.checkpoint
        table.add_row(
            "→" if phase.next else "",
            phase.id,
            phase.status,
            record.tag if record else "",
            record.time if record else "",
            (record.commit or "")[:12] if record else "",
            _metrics(record.metrics) if record else "",
        )
    table.caption = f"next: {view.next_phase}" if view.next_phase else "every phase is complete"
    return table


def _plain(view: StatusView) -> str:
    lines = [f"plan {view.plan_id} ({view.plan_path})"]
    for phase in view.phases:
        marker = "->" if phase.next else "  "
        lines.append(f"{marker} {phase.id}: {phase.status}")
        record = phase.checkpoint
        if record is not None:
            commit = f" commit {record.commit[:12]}" if record.commit else ""
            lines.append(f"     checkpoint {record.tag} at {record.time}{commit}")
            if record.metrics:
                lines.append(f"     {_metrics(record.metrics)}")
    lines.append(f"next: {view.next_phase}" if view.next_phase else "every phase is complete")
    return "\n".join(lines)
