"""``runner gate``: run phases' gates as a read-only check (CI, GPU hosts)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from runner.check import ChecksInterrupted, check_phases
from runner.cli._common import PLAN_HELP, GateOutput, domain_errors
from runner.cli.diff import REF_HELP, diff_text, hidden_rows
from runner.views.history import resolve_run
from runner.runs import interrupt_on_sigterm
from runner.workspace import open_workspace


def gate(
    phases: Annotated[
        list[str] | None, typer.Argument(help="Phase ids whose gates to run.", metavar="[PHASE]...", show_default=False)
    ] = None,
    completed: Annotated[
        bool, typer.Option("--completed", help="Run the gates of every complete phase.")
    ] = False,
    plan: Annotated[Path | None, typer.Option("--plan", metavar="FILE", help=PLAN_HELP)] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", metavar="FILE",
                     help="Write the results, bound to the tree fingerprint and this machine. Written "
                     "after each gate (atomically), so a job ended at its time limit keeps the gates it "
                     "finished; run the rest with --only."),
    ] = None,
    only: Annotated[
        list[str] | None,
        typer.Option("--only", metavar="GATE[,GATE...]",
                     help="Run only these gates of the named phases (a phase too long for one job runs "
                     "in several); the results file says which gates it covers, and `runner advance "
                     "--results A --results B` combines the files."),
    ] = None,
    logs: Annotated[
        Path | None,
        typer.Option("--logs", metavar="DIR",
                     help="Keep the gate logs in this folder (default: a new folder under the "
                     "temporary folder, named when the run starts)."),
    ] = None,
    junit: Annotated[
        Path | None,
        typer.Option("--junit", metavar="FILE", help="Write JUnit XML (a testsuite per phase, a testcase per gate) for CI."),
    ] = None,
    summary: Annotated[
        Path | None,
        typer.Option(
            "--summary", metavar="FILE",
            help="Append a Markdown summary (outcomes, metrics vs thresholds), e.g. to $GITHUB_STEP_SUMMARY.",
        ),
    ] = None,
    keep_going: Annotated[
        bool,
        typer.Option(
            "--keep-going",
            help="Run every gate even after one fails, to collect all the evidence in one run "
            "(a benchmark gate still needs every verify gate before it to pass).",
        ),
    ] = False,
    baseline: Annotated[
        str | None,
        typer.Option("--baseline", metavar="RUN",
                     help=f"Judge the results against this run as runner diff does (exit 1 on a regression); "
                     f"it must come from this machine fingerprint. {REF_HELP}"),
    ] = None,
) -> None:
    """Run the gates of the named phases (or of every complete phase) and report.

    Changes no file except --out, --logs, --junit and --summary, makes no commit and takes no lock. Works in a
    copy of the tree without .git (a GPU host). With --only GATE,... only those gates run; --out is
    written after every gate, so a job cut short keeps the gates it finished. With --baseline RUN the metrics are then compared with that
    run's: a regression (significant for samples, beyond the plan's tolerance, 10% where it declares
    none) exits 1.
    """
    output = GateOutput()
    with domain_errors():
        ws = open_workspace(plan)
        baseline_run = resolve_run(ws, baseline) if baseline is not None else None
        with _saying_what_was_kept(), interrupt_on_sigterm(), output.running():
            check = check_phases(
                ws,
                phases or [],
                completed=completed,
                out=out,
                logs=logs,
                junit=junit,
                summary=summary,
                on_result=output.on_result,
                on_progress=output.on_progress,
                keep_going=keep_going,
                on_start=output.on_start,
                on_logs=output.on_logs,
                baseline=baseline_run,
                baseline_label=baseline or "baseline",
                only=only or (),
            )
    for line in check.messages:
        typer.echo(line, err=check.exit_code != 0)
    if check.results is not None:
        summary = ", ".join(f"{phase.phase} {phase.outcome}" + (
            f" ({len(phase.coverage.covered)} of {len(phase.coverage.covered) + len(phase.coverage.not_covered)} gates)"
            if phase.coverage is not None else "") for phase in check.results.phases)
        typer.echo(f"{summary} (fingerprint {check.results.fingerprint})")
    if check.baseline is not None:
        rows = [row for row in check.baseline.rows if row.notable]
        typer.echo("")
        typer.echo(diff_text(check.baseline, rows, hidden_rows(check.baseline.rows, rows)))
    raise typer.Exit(int(check.exit_code))


@contextmanager
def _saying_what_was_kept() -> Iterator[None]:
    """An interrupted check says what --out kept before ``domain_errors`` says ``interrupted``."""
    try:
        yield
    except ChecksInterrupted as interrupted:
        for line in interrupted.messages:
            typer.echo(line, err=True)
        raise
