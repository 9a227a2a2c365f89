"""Error types and exit codes shared by every runner module.

Domain code raises these; only the CLI edge turns them into a one-line message and an
exit code, so library callers (and tests) get exceptions, not ``SystemExit``.
"""

from __future__ import annotations

from enum import IntEnum
from pathlib import Path


class ExitCode(IntEnum):
    """Process exit codes of every ``runner`` command (documented in the README)."""

    OK = 0  # every gate that ran passed
    GATE_FAILED = 1  # a gate failed or errored
    USAGE = 2  # bad command line, plan, results file or repository state
    BLOCKED = 3  # a gate needs a device (or a Python module) this machine lacks
    INTERRUPTED = 130  # SIGINT / SIGTERM


class RunnerError(Exception):
    """Base of every error the runner reports as a one-line message (exit code 2)."""

    exit_code: ExitCode = ExitCode.USAGE


class PlanError(RunnerError):
    """A plan file that cannot be read, parsed or validated.

    The message names the file, the line and column (1-based) when known, the key path
    (``phases[1].gates[0].kind``) and how to fix it.
    """

    def __init__(
        self,
        message: str,
        *,
        path: Path | str | None = None,
        line: int | None = None,
        column: int | None = None,
        key: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.message = message
        self.path = Path(path) if path is not None else None
        self.line = line
        self.column = column
        self.key = key
        self.hint = hint
        super().__init__(str(self))

    def __str__(self) -> str:
        where = str(self.path) if self.path is not None else "<plan>"
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        text = f"{where}: "
        if self.key:
            text += f"{self.key}: "
        text += self.message
        if self.hint:
            text += f" ({self.hint})"
        return text


class UsageError(RunnerError):
    """A command line or environment the runner cannot act on (exit code 2)."""


class ResultsError(RunnerError):
    """A results file that is malformed or does not fit the plan or the tree (exit code 2)."""


class LockHeldError(RunnerError):
    """Another runner process holds the repository lock (exit code 2)."""


class GitError(RunnerError):
    """A git state the runner refuses to checkpoint in (exit code 2)."""


class ReportError(RunnerError):
    """The run's evidence could not be written under ``reports/`` (a file in the way, a
    read-only or full disk); the plan is then left as it was (exit code 2)."""
