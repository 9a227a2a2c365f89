"""What would let every gate pass and then fail the checkpoint is refused before any gate runs:
a run folder reached through a symbolic link under ``reports/``, a phase path git ignores, and
``--results`` under the phase's paths."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from runner.errors import ExitCode
from runner.plan.load import load_plan
from tests.runner.repo_fixtures import cli, copy_without_git, default_phases, gate, make_repo, write


def no_gate_ran(repo, head) -> None:
    assert not (repo.root / "ran").exists()
    assert repo.head() == head and repo.git("tag", "--list") == ""
    assert load_plan(repo.plan).plan.phase("alpha").status == "pending"


def marking_phases():
    phases = default_phases()
    phases[0]["gates"][0] = gate("build", "build", "touch ran")
    return phases


@pytest.mark.parametrize("link", ["reports", "reports/demo"])
def test_a_reports_folder_linked_inside_the_repository_is_refused_before_the_gates(tmp_path, runner_env, link):
    repo = make_repo(tmp_path / "repo", marking_phases())
    write(repo.root, "out/reports/.keep", "")
    (repo.root / link).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(repo.root / "out" / "reports", (repo.root / link).parent), repo.root / link)
    repo.git("add", "-A")
    repo.git("commit", "-q", "-m", "reports kept elsewhere")
    head = repo.head()
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == ExitCode.USAGE, result.text
    assert f"{link} is a symbolic link" in result.stderr and "replace the link" in result.stderr
    no_gate_ran(repo, head)
    assert list((repo.root / "out" / "reports").iterdir()) == [repo.root / "out" / "reports" / ".keep"]


def test_a_real_reports_folder_still_checkpoints(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 0, result.text


@pytest.mark.parametrize("rule, path, shown", [
    ("src/\n", "src/", ".gitignore:4:src/"),
    ("*.py\n", "src/code.py", ".gitignore:4:*.py"),
    ("/src\n", "./src", ".gitignore:4:/src"),
])
def test_a_phase_path_git_ignores_is_refused_before_the_gates(tmp_path, runner_env, rule, path, shown):
    phases = marking_phases()
    phases[0]["paths"] = [path]
    repo = make_repo(tmp_path / "repo", phases)
    if path == "src/code.py":  # a tracked file is committed although ignored: make it untracked
        repo.git("rm", "-q", "--cached", "src/code.py")
        repo.git("commit", "-q", "-m", "untrack")
    (repo.root / ".gitignore").write_text((repo.root / ".gitignore").read_text() + rule)
    repo.git("add", ".gitignore")
    repo.git("commit", "-q", "-m", "ignore")
    head = repo.head()
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == ExitCode.USAGE, result.text
    assert f"path {path!r} of phase alpha is ignored by git ({shown}" in result.stderr
    assert "plans/demo.md:" in result.stderr and "hint:" not in result.stderr  # the plan's line, not git's hint
    no_gate_ran(repo, head)


def test_a_path_a_gate_makes_that_git_would_ignore_is_refused_before_the_gates(tmp_path, runner_env):
    phases = default_phases()
    phases[0]["paths"] = ["out/"]
    phases[0]["gates"][0] = gate("build", "build", "mkdir -p out && echo made > out/file && touch ran")
    repo = make_repo(tmp_path / "repo", phases)
    (repo.root / ".gitignore").write_text((repo.root / ".gitignore").read_text() + "out/\n")
    repo.git("add", ".gitignore")
    repo.git("commit", "-q", "-m", "ignore")
    head = repo.head()
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == ExitCode.USAGE, result.text
    assert "path 'out/' of phase alpha is ignored by git (.gitignore:4:out/" in result.stderr
    no_gate_ran(repo, head)


def test_a_tracked_file_that_git_ignores_is_still_a_path_the_checkpoint_commits(tmp_path, runner_env):
    phases = default_phases()
    phases[0]["paths"] = ["src/code.py"]
    repo = make_repo(tmp_path / "repo", phases)
    (repo.root / ".gitignore").write_text((repo.root / ".gitignore").read_text() + "*.py\n")
    repo.git("add", ".gitignore")
    repo.git("commit", "-q", "-m", "ignore")
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 0, result.text


def test_results_under_the_phases_paths_are_refused_before_any_check(gpu_results, runner_env):
    repo, results = gpu_results
    head = repo.head()
    inside = repo.root / "src" / "res.json"
    shutil.copy(results, inside)
    result = cli(runner_env, repo.root, "advance", "--results", "src/res.json")
    assert result.exit_code == ExitCode.USAGE, result.text
    assert "--results src/res.json lies inside 'src/'" in result.stderr
    assert "move it outside the phase's paths" in result.stderr
    assert repo.head() == head and not (repo.root / "reports").exists()
    inside.rename(repo.root / "res.json")  # outside the paths, inside the tree: fine
    result = cli(runner_env, repo.root, "advance", "--results", "res.json")
    assert result.exit_code == 0, result.text


def test_out_of_a_gate_run_is_left_out_of_the_fingerprint_inside_the_paths(tmp_path, runner_env):
    """``runner gate --out src/res.json``: the file it writes is no change of the tree."""
    repo = make_repo(tmp_path / "repo")
    host = copy_without_git(repo.root, tmp_path / "host")
    made = cli(runner_env, host, "gate", "alpha", "--out", "src/res.json")
    assert made.exit_code == 0, made.text
    first = json.loads((host / "src" / "res.json").read_text())["fingerprint"]
    again = cli(runner_env, host, "gate", "alpha", "--out", "src/res.json")
    assert again.exit_code == 0, again.text
    assert json.loads((host / "src" / "res.json").read_text())["fingerprint"] == first
