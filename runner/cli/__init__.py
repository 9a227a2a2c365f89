"""The ``runner`` command line: ``status``, ``advance`` and ``gate``.

Each command lives in its own module and only calls the use cases in ``runner.status``,
``runner.advance`` and ``runner.gate``; domain errors become a one-line message on stderr
and an exit code (see ``runner.errors.ExitCode``).
"""

from __future__ import annotations

import typer

from runner.cli import advance, gate, status
from runner.cli._common import EXIT_CODES_EPILOG

app = typer.Typer(
    name="runner",
    help="Drive a phase-gated plan: run each phase's gates, record the evidence, checkpoint on a pass.",
    epilog=EXIT_CODES_EPILOG,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

app.command("status", epilog=EXIT_CODES_EPILOG)(status.status)
app.command("advance", epilog=EXIT_CODES_EPILOG)(advance.advance)
app.command("gate", epilog=EXIT_CODES_EPILOG)(gate.gate)


def main() -> None:
    """Entry point of the ``runner`` script."""
    app(prog_name="runner")


__all__ = ["app", "main"]
