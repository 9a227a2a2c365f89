"""Where the runner cannot write: refused before the gates when it can be told, a one-line error
with exit code 2 (not 1, a failed gate) when the disk refuses afterwards, and nothing
half-written left behind."""

from __future__ import annotations

import os

import pytest

from runner.plan.load import load_plan
from tests.runner.repo_fixtures import cli, default_phases, gate, make_repo, write


def test_a_file_named_reports_is_refused_before_any_gate(tmp_path, runner_env):
    phases = default_phases()
    phases[0]["gates"] = [gate("check", "verify", "touch ran.txt")]
    repo = make_repo(tmp_path / "repo", phases)
    write(repo.root, "reports", "a file where the reports folder goes\n")
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 2, result.text
    assert "is a file where the runner keeps its reports" in result.stderr
    assert not (repo.root / "ran.txt").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through a read-only mode")
def test_a_read_only_reports_folder_is_refused_before_any_gate(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    (repo.root / "reports").mkdir()
    (repo.root / "reports").chmod(0o555)
    try:
        result = cli(runner_env, repo.root, "advance")
    finally:
        (repo.root / "reports").chmod(0o755)
    assert result.exit_code == 2 and "not writable" in result.stderr


def test_reports_taken_away_while_the_gates_ran_is_a_clean_error(tmp_path, runner_env):
    """The gate replaces reports/ by a file: the report cannot be written after the gates."""
    phases = default_phases()
    phases[0]["gates"] = [gate("check", "verify", "rm -rf reports && echo x > reports")]
    repo = make_repo(tmp_path / "repo", phases)
    plan_before = repo.plan.read_text()
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 2, result.text
    assert "\nrunner: error: cannot write the run's report" in result.stderr
    assert "the plan was not changed and nothing was committed" in result.stderr
    assert repo.plan.read_text() == plan_before and repo.commit_count() == 1


def test_init_with_a_title_that_is_not_utf8_leaves_nothing(tmp_path, runner_env):
    title = os.fsdecode(b"bad \xff title")  # what a non-UTF-8 argument becomes
    result = cli(runner_env, tmp_path, "init", "plans/demo.md", "--title", title)
    assert result.exit_code == 2 and "not UTF-8" in result.stderr
    assert not (tmp_path / "plans" / "demo.md").exists()
    assert cli(runner_env, tmp_path, "init", "plans/demo.md", "--title", "good").exit_code == 0


def test_init_under_a_file_is_a_usage_error(tmp_path, runner_env):
    write(tmp_path, "plans", "a file, not a folder\n")
    result = cli(runner_env, tmp_path, "init", "plans/demo.md")
    assert result.exit_code == 2 and "a file in the way" in result.stderr


def test_init_names_the_plan_by_its_path_from_the_root(tmp_path, runner_env):
    make_repo(tmp_path / "repo", git_init=True)
    assert cli(runner_env, tmp_path / "repo", "init", "plans/new.md").exit_code == 0
    doc = load_plan(tmp_path / "repo" / "plans" / "new.md")
    assert "edit plans/new.md" in doc.plan.phases[0].gates[0].run
    quoted = tmp_path / "repo" / "plans" / "it's.md"
    assert cli(runner_env, tmp_path / "repo", "init", str(quoted), "--id", "quoted").exit_code == 0
    result = cli(runner_env, tmp_path / "repo", "gate", "first", "--plan", str(quoted))
    assert "edit plans/it's.md" in result.text  # the placeholder's message, quoted for the shell
