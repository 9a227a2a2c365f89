"""What the command modules share: the exit-code epilog, error handling and progress output."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.live import Live
from rich.text import Text

from runner.errors import ExitCode, RunnerError
from runner.records.results import GateResult

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
    """Prints each gate's start, progress and result as they happen.

    On a terminal a live line shows the running gate; elsewhere (a CI log) every event is one
    line of its own: the start with the log file, progress at most every ``PROGRESS_EVERY_S``
    seconds, and the result. A gate that fails or errors shows the last lines of its output
    and the path of its full log.
    """

    PROGRESS_EVERY_S = 30.0
    TAIL_LINES = 15

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or stderr_console()
        self.live: Live | None = None
        self.logs: dict[str, Path] = {}
        self._last_progress: dict[str, float] = {}

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

    def _line(self, text: Text | str) -> None:
        self.console.print(text)
        self.console.file.flush()

    def on_logs(self, folder: Path) -> None:
        self._line(f"gate logs in {_shown_path(folder)}")

    def on_start(self, phase: str, gate: str, log: Path) -> None:
        self.logs[gate] = Path(log)
        self._last_progress[gate] = 0.0
        if self.live is None:
            self._line(f"{phase} / {gate}: started (log {_shown_path(log)})")

    def on_progress(self, gate: str, elapsed: float, done: int | None, total: int | None) -> None:
        count = ""
        if done is not None:
            count = f"  {done}/{total}" if total else f"  {done}"
        if self.live is not None:
            self.live.update(Text(f"  {gate}: running {elapsed:6.1f} s{count}"))
            return
        if elapsed - self._last_progress.get(gate, 0.0) >= self.PROGRESS_EVERY_S:
            self._last_progress[gate] = elapsed
            self._line(f"  {gate}: running {elapsed:.0f} s{count}")

    def on_result(self, phase: str, result: GateResult) -> None:
        if self.live is not None:
            self.live.update(Text(""))
        style = {"PASS": "green", "BLOCKED": "yellow", "SKIPPED": "dim"}.get(result.outcome, "red")
        line = Text(f"{phase} / {result.name} ({result.kind}): ")
        line.append(result.outcome, style=f"bold {style}")
        line.append(f" in {result.duration_s:.1f} s: {result.reason}")
        self._line(line)
        if result.outcome in ("FAIL", "ERROR"):
            tail = [text for text in result.log_tail.splitlines() if text.strip()][-self.TAIL_LINES :]
            if tail:
                self._line(Text(f"  last {len(tail)} line(s) of its output:", style="dim"))
                for text in tail:
                    self._line(Text("  | " + text))
            log = self.logs.get(result.name)
            if log is not None:
                self._line(f"  full log: {_shown_path(log)}")


def _shown_path(path: Path) -> str:
    """``path`` relative to the current folder when inside it, else absolute."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except (ValueError, OSError):
        return str(Path(path).resolve())


def plain_help() -> None:
    """Help in the words of the command line, not of the framework: argument usage as
    ``PHASE``/``[PHASE]...`` (not ``{PHASE}``), no ``<list[str]>`` after arguments, and option
    values as ``PATH``/``FLOAT`` (not ``<path>``) where no metavar is given."""
    from typer import core

    if getattr(core.TyperArgument, "_runner_plain", False):
        return
    # These are typer internals (0.2x); on a typer without them keep its own wording.
    option_type = getattr(core.TyperOption, "display_type_rich", None)
    if option_type is None or not hasattr(core.TyperArgument, "display_name_raw"):
        return

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
