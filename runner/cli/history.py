"""``runner history``: the runs under reports/ and the checkpoints of the plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from runner.cli._common import PLAN_HELP, domain_errors
from runner.formatting import short, text_columns
from runner.history import describe_machine, find_runs, plan_checkpoints
from runner.workspace import open_workspace


def history(
    phase: Annotated[
        str | None, typer.Argument(help="Only this phase's runs and checkpoint.", show_default=False)
    ] = None,
    plan: Annotated[Path | None, typer.Option("--plan", help=PLAN_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """List the runs of the plan (oldest first: run id, time, outcome, machine, fingerprints)
    from reports/PLAN/PHASE/RUN/results.json, and the phases' checkpoints.
    """
    with domain_errors():
        ws = open_workspace(plan)
        if phase is not None:
            ws.plan.phase(phase)  # an unknown phase is a usage error naming the known ones
        scan = find_runs(ws.root, ws.plan.id, phase)
        checkpoints = [c for c in plan_checkpoints(ws) if phase is None or c.phase == phase]
    if as_json:
        typer.echo(json.dumps({
            "plan": {"id": ws.plan.id, "path": ws.plan_rel},
            "runs": [run.to_json(ws.root) for run in scan.runs],
            "checkpoints": [record.to_json() for record in checkpoints],
            "skipped": scan.skipped,
        }, indent=2))
        return
    lines = [f"plan {ws.plan.id} ({ws.plan_rel})", "", "runs:"]
    if scan.runs:
        rows = [("phase", "run", "time", "outcome", "machine", "tree", "machine fp")]
        rows += [
            (run.phase or "-", run.path.parent.name, run.results.created, run.outcome,
             describe_machine(run.machine), short(run.results.fingerprint), short(run.machine.fingerprint))
            for run in scan.runs
        ]
        lines += text_columns(rows)
    else:
        lines.append(f"  none under reports/{ws.plan.id}/")
    lines += ["", "checkpoints:"]
    if checkpoints:
        rows = [("phase", "tag", "time", "commit", "report")]
        rows += [
            (c.phase, c.tag, c.time, (c.commit or "-")[:12], c.report) for c in checkpoints
        ]
        lines += text_columns(rows)
    else:
        lines.append("  none yet")
    for problem in scan.skipped:
        lines.append(f"skipped: {problem}")
    typer.echo("\n".join(lines))

