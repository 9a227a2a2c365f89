"""The ``runner`` command line: ``status``, ``advance``, ``gate``, ``report``, ``history``, ``diff``
and ``init``.

Each command lives in its own module and only calls the use cases (``runner.views.status``,
``runner.advance``, ``runner.check``, ``runner.views.html``, ``runner.views.history``,
``runner.views.diff``, ``runner.plan.scaffold``); domain errors become a one-line message on stderr
and an exit code (see ``runner.errors.ExitCode``).
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Annotated

import typer

import runner
from runner.cli import advance, diff, gate, history, init, report, status
from runner.cli._common import EXIT_CODES_EPILOG, plain_help
from runner.runs import set_program

plain_help()

app = typer.Typer(
    name="runner",
    help="Drive a phase-gated plan: run each phase's gates, record the evidence, checkpoint on a pass.",
    epilog=EXIT_CODES_EPILOG,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(runner.TOOL)
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", "-V", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Drive a phase-gated plan: run each phase's gates, record the evidence, checkpoint on a pass."""

app.command("status", epilog=EXIT_CODES_EPILOG)(status.status)
app.command("advance", epilog=EXIT_CODES_EPILOG)(advance.advance)
app.command("gate", epilog=EXIT_CODES_EPILOG)(gate.gate)
app.command("report", epilog=EXIT_CODES_EPILOG)(report.report)
app.command("history", epilog=EXIT_CODES_EPILOG)(history.history)
app.command("diff", epilog=EXIT_CODES_EPILOG)(diff.diff)
app.command("init", epilog=EXIT_CODES_EPILOG)(init.init)


def main() -> None:
    """Entry point of the ``runner`` script."""
    set_program(invoked_as(sys.argv[0]))
    app(prog_name="runner")


def invoked_as(argv0: str) -> str:
    """How the user ran this command, for hints that name commands that work as typed:
    ``runner`` when that name finds this script on ``PATH``, ``python -m runner`` for the
    module, else the path they typed (``.venv/bin/runner``)."""
    if not argv0 or argv0.endswith("__main__.py") or argv0 == "-m":
        return "python -m runner"
    name = os.path.basename(argv0)
    found = shutil.which(name)
    if found and os.path.realpath(found) == os.path.realpath(argv0):
        return name
    if os.sep not in argv0:
        return argv0
    try:
        rel = os.path.relpath(argv0)
    except ValueError:
        return argv0
    return rel if not rel.startswith("..") else argv0


__all__ = ["app", "main"]
