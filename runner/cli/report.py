"""``runner report``: one self-contained HTML page for the plan (phases, latest gates, plots)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from runner.cli._common import PLAN_HELP, domain_errors
from runner.views.html import DEFAULT_OUT, write_html_report
from runner.workspace import open_workspace


def report(
    plan: Annotated[Path | None, typer.Option("--plan", metavar="FILE", help=PLAN_HELP)] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", metavar="FILE", help="Where to write the page (default: reports/index.html under the root)."),
    ] = None,
) -> None:
    """Write one static HTML page for the plan: the phases as a timeline with their
    checkpoints, each phase's latest gate results, and plots of what the gates declared
    (*.plot.json artifacts) and of the headline metrics across runs. It needs no server or network to read.
    """
    with domain_errors():
        ws = open_workspace(plan)
        target = write_html_report(ws, out if out is not None else ws.root / DEFAULT_OUT)
    typer.echo(f"report written to {target}")
