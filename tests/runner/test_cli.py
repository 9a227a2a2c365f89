"""The command line as a whole: help texts, exit codes, entry points."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runner.cli import app

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = ["status", "advance", "gate", "report", "history", "diff", "init"]
PLANLESS = {"init"}  # writes a new plan rather than reading one


@pytest.mark.parametrize("args", [[], *([name] for name in COMMANDS)])
def test_every_help_mentions_the_exit_codes(args):
    result = CliRunner().invoke(app, [*args, "--help"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for code in ("0 all passed", "1 a gate failed", "2 usage or plan error",
                 "3 blocked on a missing device", "130 interrupted"):
        assert code in text


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_help_text(name):
    result = CliRunner().invoke(app, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert ("--plan" in result.output) != (name in PLANLESS)
    command = next(c for c in app.registered_commands if c.name == name)
    assert (command.callback.__doc__ or "").strip()


def test_python_dash_m_runner_works():
    proc = subprocess.run(
        [sys.executable, "-m", "runner", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "advance" in proc.stdout and "130 interrupted" in " ".join(proc.stdout.split())


def test_unknown_option_is_a_usage_error():
    result = CliRunner().invoke(app, ["status", "--nope"])
    assert result.exit_code == 2


def test_readme_documents_the_exit_codes():
    readme = (ROOT / "README.md").read_text()
    assert "## Exit codes" in readme
    for code in ("0", "1", "2", "3", "130"):
        assert f"| {code} |" in readme
