"""A ``call:`` gate's module comes from the user's repository first: a ``phases/`` folder without
``__init__.py`` is not hidden by a package of the same name installed elsewhere."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from runner.gates.execute import _command
from runner.gates.preflight import check_calls
from runner.plan.load import load_plan
from tests.runner.gate_helpers import make_gate
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


def own_runner_repo(root: Path, layout: str, call: str):
    """A git repository with a ``runner`` of its own (``layout``: a package or ``runner.py``)
    and one ``call:`` gate."""
    phases = [{"id": "alpha", "title": "First", "status": "pending", "paths": ["src/"],
               "gates": [{"name": "g", "kind": "verify", "call": call, "expect": {"answer": "== 42"}}]}]
    repo = make_repo(root, phases, git_init=False)
    if layout == "package":
        write(repo.root, "runner/__init__.py", "NAME = 'the repository runner'\n")
        write(repo.root, "runner/checks.py", GATE)
    else:
        write(repo.root, "runner.py", "NAME = 'the repository runner'\n")
    write(repo.root, "src/gate.py", "import runner\n\ndef run():\n"
                                    "    return {'answer': 42 if runner.NAME == 'the repository runner' else 0}\n")
    repo.git("init", "-q", "-b", "main")
    repo.git("config", "user.name", "Test Person")
    repo.git("config", "user.email", "test@example.com")
    repo.git("add", "-A")
    repo.git("commit", "-q", "-m", "base")
    return repo


@pytest.mark.parametrize("layout, call", [
    ("package", "src.gate:run"),
    ("module", "src.gate:run"),
    ("package", "runner.checks:run"),
])
def test_a_repository_with_its_own_runner_does_not_hide_the_runners_machinery(tmp_path, runner_env, layout, call):
    """The gate's child runs this runner's ``runner.gates.call``; the gate's own ``import runner``
    is the repository's."""
    repo = own_runner_repo(tmp_path / "repo", layout, call)
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 0, result.text
    assert "alpha: PASS; checkpoint" in result.stdout
    assert "No module named" not in result.text


def test_the_call_child_loads_the_runner_by_location_not_by_sys_path(tmp_path):
    """Without site-packages (``-S``, as with a runner installed elsewhere than the repository's
    ``runner/``) the child still runs this runner's machinery, and the gate's ``runner`` is the
    repository's."""
    repo = own_runner_repo(tmp_path / "repo", "package", "runner.checks:run")
    gate = make_gate("g", call="src.gate:run")
    argv = _command(gate)
    env = {"PATH": os.environ.get("PATH", ""), "RUNNER_METRICS": str(tmp_path / "metrics.json")}
    proc = subprocess.run([argv[0], "-S", *argv[1:]], cwd=repo.root, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"answer": 42}


@pytest.mark.parametrize("safe_path", ["", "1"])
def test_the_call_child_leaves_only_its_own_folder_off_sys_path(tmp_path, safe_path):
    """A gate named like a module of runner/gates (``log``) is the repository's; with
    ``PYTHONSAFEPATH`` the child's folder was never on ``sys.path`` and nothing else is dropped."""
    root = tmp_path / "repo"
    write(root, "log.py", "def run():\n    return {'answer': 42}\n")
    argv = _command(make_gate("g", call="log:run"))
    env = {"PATH": os.environ.get("PATH", ""), "RUNNER_METRICS": str(tmp_path / "metrics.json"),
           "PYTHONPATH": str(root), "PYTHONSAFEPATH": safe_path}
    proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"answer": 42}
