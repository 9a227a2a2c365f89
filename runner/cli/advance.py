"""``runner advance``: run the next phase's gates (or import their results) and checkpoint it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from runner.advance import advance as advance_plan
from runner.cli._common import PLAN_HELP, GateOutput, domain_errors
from runner.workspace import open_workspace


def advance(
    plan: Annotated[Path | None, typer.Option("--plan", metavar="FILE", help=PLAN_HELP)] = None,
    results: Annotated[
        list[Path] | None,
        typer.Option(
            "--results", metavar="FILE",
            help="Checkpoint results written by `runner gate PHASE --out FILE` on another machine "
            "instead of running the gates here. Repeat it to combine the files of several jobs "
            "(`runner gate PHASE --only GATE,... --out FILE`, or a job cut short and the rest run "
            "with --only): one tree, every gate covered, a gate held twice with one outcome. A "
            "file is no part of the tree (left out of its fingerprint) and may not lie under the "
            "phase's paths.",
        ),
    ] = None,
    phase: Annotated[
        str | None,
        typer.Option(
            "--phase",
            metavar="PHASE",
            help="The phase to run. Without --evidence it must be the next one (phases are "
            "checkpointed in order).",
        ),
    ] = None,
    evidence: Annotated[
        bool,
        typer.Option(
            "--evidence",
            help="Run (or, with --results, import) the gates of a later phase that waits on an "
            "earlier one and keep the report as evidence: no status change, no commit.",
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the phase and its gate steps; change nothing.")
    ] = False,
    wait: Annotated[
        float | None,
        typer.Option(
            "--wait",
            metavar="SECONDS",
            min=0,
            help="When another runner holds the repository lock, wait up to SECONDS for it "
            "(`--wait inf`: no limit) instead of exiting with code 2 at once.",
        ),
    ] = None,
) -> None:
    """Run the gates of the first phase that is not complete and checkpoint it when all pass.

    On a pass the plan is updated and one commit (tagged PLAN/PHASE) holds the plan, the run's
    report folder and the phase's paths. A failure or a blocked gate is recorded in the plan
    and the report, with no commit; a run that could only block leaves an earlier run's verdict
    in the plan. Only one runner works in a repository at a time: a second one names the
    holder of the lock and exits with code 2, or waits with --wait.

    With --evidence (and --phase PHASE or --results FILE), the gates of a phase that waits on
    an earlier one run anyway; the report is kept under reports/ as evidence, the plan is not
    changed and nothing is committed.

    With several --results files the phase is recorded from all of them; a gate that no file
    covers is recorded BLOCKED and named, and the phase is not checkpointed.
    """
    output = GateOutput()
    with domain_errors():
        ws = open_workspace(plan)
        with output.running():
            outcome = advance_plan(
                ws,
                results=results or (),
                dry_run=dry_run,
                wait_s=wait,
                phase_id=phase,
                evidence=evidence,
                on_result=output.on_result,
                on_progress=output.on_progress,
                on_start=output.on_start,
            )
    for line in outcome.messages:
        typer.echo(line, err=outcome.exit_code != 0)
    raise typer.Exit(int(outcome.exit_code))
