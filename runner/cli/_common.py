"""What the command modules share: the exit-code epilog, error handling and progress output."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import typer
from rich.console import Console
from rich.live import Live
from rich.text import Text

from runner.errors import ExitCode, RunnerError
from runner.results import GateResult

EXIT_CODES_EPILOG = (
    "Exit codes: 0 all passed; 1 a gate failed; 2 usage or plan error; "
    "3 blocked on a missing device; 130 interrupted."
)

PLAN_HELP = "Plan file (default: [tool.runner] plan in pyproject.toml, else the only plan in plans/)."


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def stdout_console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def fail(error: RunnerError) -> NoReturn:
    """Print ``error`` as one line on stderr and exit with its code."""
    text = " ".join(str(error).split()) or type(error).__name__
    typer.echo(f"runner: error: {text}", err=True)
    raise typer.Exit(int(error.exit_code))


@contextmanager
def domain_errors() -> Iterator[None]:
    """Turn ``RunnerError`` into a one-line message and ``KeyboardInterrupt`` into exit 130."""
    try:
        yield
    except RunnerError as error:
        fail(error)
    except KeyboardInterrupt:
        typer.echo("runner: interrupted", err=True)
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None


class GateOutput:
    """Prints each gate's result as it comes and, on a terminal, a live line while it runs."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or stderr_console()
        self.live: Live | None = None

    @contextmanager
    def running(self) -> Iterator[GateOutput]:
        if not self.console.is_terminal:
            yield self
            return
        with Live(Text(""), console=self.console, transient=True, refresh_per_second=4) as live:
            self.live = live
            try:
                yield self
            finally:
                self.live = None

    def on_progress(self, gate: str, elapsed: float, done: int | None, total: int | None) -> None:
        if self.live is None:
            return
        count = ""
        if done is not None:
            count = f"  {done}/{total}" if total else f"  {done}"
        self.live.update(Text(f"  {gate}: running {elapsed:6.1f} s{count}"))

    def on_result(self, phase: str, result: GateResult) -> None:
        if self.live is not None:
            self.live.update(Text(""))
        style = {"PASS": "green", "BLOCKED": "yellow", "SKIPPED": "dim"}.get(result.outcome, "red")
        line = Text(f"{phase} / {result.name} ({result.kind}): ")
        line.append(result.outcome, style=f"bold {style}")
        line.append(f" in {result.duration_s:.1f} s: {result.reason}")
        self.console.print(line)


def plain_help() -> None:
    """Help in the words of the command line, not of the framework: argument usage as
    ``PHASE``/``[PHASE]...`` (not ``{PHASE}``), no ``<list[str]>`` after arguments, and option
    values as ``PATH``/``FLOAT`` (not ``<path>``) where no metavar is given."""
    from typer import core

    if getattr(core.TyperArgument, "_runner_plain", False):
        return
    option_type = core.TyperOption.display_type_rich

    def argument_usage(self) -> str:
        name = self.display_name_raw
        if self.metavar is None:
            name = name.upper()
        if name.startswith("[") or name.endswith("..."):
            return name
        name = name if self.required else f"[{name}]"
        return name + ("..." if self.nargs != 1 else "")

    def option_display(self, ctx):
        text = option_type(self, ctx)
        if text and "<" in text:
            text = re.sub(r"<([^>]*)>", lambda m: re.sub(r"\W", "", m.group(1)).upper() or "VALUE", text)
        return text

    core.TyperArgument.display_type_rich = lambda self, ctx: None
    core.TyperArgument._usage_display_name = argument_usage
    core.TyperOption.display_type_rich = option_display
    core.TyperArgument._runner_plain = True
