"""A ``call:`` gate's module comes from the user's repository first: a ``phases/`` folder without
``__init__.py`` is not hidden by a package of the same name installed elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.gates.preflight import check_calls
from runner.plan.load import load_plan
from tests.runner.repo_fixtures import cli, make_repo, write

GATE = 'def run():\n    return {"answer": 42}\n'


@pytest.fixture
def shadowing_site(tmp_path: Path) -> Path:
    """A folder holding a regular package ``phases`` without ``second`` (an installed one)."""
    site = tmp_path / "site"
    write(site, "phases/__init__.py", "")
    write(site, "phases/other.py", "def run():\n    return {}\n")
    return site


def user_repo(root: Path):
    phases = [{"id": "alpha", "title": "First", "status": "pending", "paths": ["phases/"],
               "gates": [{"name": "second", "kind": "verify", "call": "phases.second:run",
                          "expect": {"answer": "== 42"}}]}]
    repo = make_repo(root, phases, git_init=False)
    write(repo.root, "phases/second.py", GATE)  # a namespace folder: no __init__.py
    return repo


def test_preflight_finds_the_repository_module_before_an_installed_package(tmp_path, shadowing_site, monkeypatch):
    repo = user_repo(tmp_path / "repo")
    monkeypatch.syspath_prepend(str(shadowing_site))
    doc = load_plan(repo.plan)
    check_calls(doc, doc.plan.phase("alpha"), repo.root)  # no PlanError: phases/second.py exists


def test_gate_runs_the_repository_module_before_an_installed_package(tmp_path, shadowing_site, runner_env):
    repo = user_repo(tmp_path / "repo")
    runner_env.setenv("PYTHONPATH", str(shadowing_site))  # the gate's child sees the other package
    result = cli(runner_env, repo.root, "gate", "alpha")
    assert result.exit_code == 0, result.text
    assert "alpha PASS" in result.stdout


def test_only_the_calls_own_package_is_taken_from_the_root(tmp_path, runner_env):
    """A folder in the repository named like a standard module (``json/``) does not replace it."""
    phases = [{"id": "alpha", "title": "First", "status": "pending", "paths": [],
               "gates": [{"name": "g", "kind": "verify", "call": "tools.gate:run", "expect": {"ok": "== 1"}}]}]
    repo = make_repo(tmp_path / "repo", phases, git_init=False)
    write(repo.root, "json/readme.txt", "a folder named like the standard module\n")
    write(repo.root, "tools/gate.py", "import json\n\ndef run():\n    return {'ok': int(hasattr(json, 'dumps'))}\n")
    result = cli(runner_env, repo.root, "gate", "alpha")
    assert result.exit_code == 0, result.text
