"""``runner status``: show every phase, its last checkpoint and which phase is next."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from runner.cli._common import PLAN_HELP, domain_errors, stdout_console
from runner.formatting import format_metric, json_text
from runner.views.history import PhaseRuns, describe_phase, find_runs, phase_runs
from runner.records.run_folder import headline_metrics
from runner.views.status import StatusView, plan_status
from runner.workspace import Workspace, open_workspace


def status(
    plan: Annotated[Path | None, typer.Option("--plan", metavar="FILE", help=PLAN_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Show each phase's status, last checkpoint and headline metrics, and the next phase."""
    with domain_errors():
        ws = open_workspace(plan)
        view = plan_status(ws)
        scan = find_runs(ws.root, ws.plan.id)
        runs = phase_runs(scan)
    for problem in scan.skipped:
        typer.echo(f"runner: warning: {problem}", err=True)
    described = {p.id: describe_phase(p.status, runs.get(p.id), socket.gethostname()) for p in view.phases}
    headline = {p.id: _headline(ws, p.id, p.checkpoint, runs.get(p.id)) for p in view.phases}
    if as_json:
        data = view.to_json()
        for phase in data["phases"]:
            phase["summary"] = described[phase["id"]]
            phase["headline"] = headline[phase["id"]][0]
            phase["headline_source"] = headline[phase["id"]][1]
            phase["runs"] = _runs_json(runs.get(phase["id"]))
        typer.echo(json_text(data))
        return
    console = stdout_console()
    if console.is_terminal:
        console.print(_table(view, described, headline))
    else:
        typer.echo(_plain(view, described, headline))


def _headline(ws: Workspace, phase_id: str, checkpoint, runs: PhaseRuns | None) -> tuple[dict, str | None]:
    """The phase's headline metrics and where they come from: its checkpoint, else the run
    that explains its status (or the evidence that waits)."""
    if checkpoint is not None and checkpoint.metrics:
        return dict(checkpoint.metrics), f"checkpoint {checkpoint.tag}"
    shown = runs.shown if runs is not None else None
    if shown is None:
        return {}, None
    [results] = shown.phase_results()
    metrics = headline_metrics(ws.plan.phase(phase_id), results.gates)
    return metrics, (f"run {shown.run_id}" if metrics else None)


def _runs_json(runs: PhaseRuns | None) -> dict:
    def one(run):
        return None if run is None else {"run_id": run.run_id, "outcome": run.outcome,
                                         "gpu": run.machine.gpu_name, "reason": run.meta.reason}

    if runs is None:
        return {"count": 0, "verdict": None, "blocked": None, "evidence": None}
    return {"count": runs.count, "verdict": one(runs.verdict), "blocked": one(runs.blocked),
            "evidence": one(runs.evidence)}


def _metrics(metrics: dict) -> str:
    return ", ".join(f"{name}={format_metric(value)}" for name, value in metrics.items())


def _table(view: StatusView, described: dict[str, str], headline: dict[str, tuple[dict, str | None]]) -> Table:
    table = Table(title=f"{view.plan_id}: {view.plan_title}" if view.plan_title else view.plan_id)
    for column in ("", "phase", "status", "checkpoint", "time", "commit", "headline metrics"):
        table.add_column(column)
    for phase in view.phases:
        record = phase.checkpoint
        table.add_row(
            "→" if phase.next else "",
            phase.id,
            described[phase.id],
            record.tag if record else "",
            record.time if record else "",
            (record.commit or "")[:12] if record else "",
            _metrics(headline[phase.id][0]),
        )
    table.caption = f"next: {view.next_phase}" if view.next_phase else "every phase is complete"
    return table


def _plain(view: StatusView, described: dict[str, str], headline: dict[str, tuple[dict, str | None]]) -> str:
    lines = [f"plan {view.plan_id} ({view.plan_path})"]
    for phase in view.phases:
        marker = "->" if phase.next else "  "
        lines.append(f"{marker} {phase.id}: {described[phase.id]}")
        record = phase.checkpoint
        if record is not None:
            commit = f" commit {record.commit[:12]}" if record.commit else ""
            lines.append(f"     checkpoint {record.tag} at {record.time}{commit}")
        metrics, source = headline[phase.id]
        if metrics:
            lines.append(f"     {_metrics(metrics)}" + (f" ({source})" if record is None and source else ""))
    lines.append(f"next: {view.next_phase}" if view.next_phase else "every phase is complete")
    return "\n".join(lines)
