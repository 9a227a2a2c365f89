"""The command line speaks its own words: -h, --version, and help without framework internals."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

import runner
from runner.cli import app

COMMANDS = ["status", "advance", "gate", "report", "history", "diff", "init"]


def _help(*args: str) -> str:
    result = CliRunner().invoke(app, [*args, "-h"])
    assert result.exit_code == 0, result.output
    return result.output


def test_version():
    for flag in ("--version", "-V"):
        result = CliRunner().invoke(app, [flag])
        assert result.exit_code == 0 and result.output.strip() == runner.TOOL


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_has_no_framework_metavars(command):
    text = _help(*([command] if command else []))
    assert "Usage: runner" in text
    assert not re.search(r"<[a-z\[\], |]+>", text), text  # <list[str]>, <path>, <str>
    usage = text.splitlines()[0]
    assert "{" not in usage, usage


def test_usage_names_the_arguments():
    assert _help("gate").splitlines()[0].endswith("[PHASE]...")
    assert _help("diff").splitlines()[0].endswith("A B")
    assert _help("history").splitlines()[0].endswith("[PHASE]")
    assert "--logs DIR" in _help("gate") and "--out FILE" in _help("gate")
