"""What the runner writes under reports/ and git: a run the plan records is for committing; a
run the plan does not record, and the generated HTML page, leave ``git status`` clean."""

from __future__ import annotations

from tests.runner.repo_fixtures import cli, gpu_phases, make_repo, write


def test_a_run_that_only_blocked_again_and_the_page_leave_git_status_clean(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", gpu_phases())
    assert cli(runner_env, repo.root, "advance").exit_code == 3  # recorded: the plan says blocked
    repo.git("add", "-A")
    repo.git("commit", "-qm", "blocked on a CPU machine")
    second = cli(runner_env, repo.root, "advance")  # the plan keeps blocked: this run is not recorded
    assert second.exit_code == 3 and "git ignores it" in second.stderr
    assert cli(runner_env, repo.root, "report").exit_code == 0
    assert (repo.root / "reports" / "index.html").is_file()
    assert repo.porcelain() == ""
    runs = sorted((repo.root / "reports" / "demo" / "alpha").iterdir())
    assert len(runs) == 2 and (runs[-1] / ".gitignore").is_file() and not (runs[0] / ".gitignore").exists()
    status = cli(runner_env, repo.root, "status").stdout
    assert f"(run {runs[-1].name}, 1 gate passed, 1 blocked)" in status  # ignored by git, still shown


def test_a_reports_gitignore_of_the_user_is_left_alone(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    write(repo.root, "reports/.gitignore", "# mine\n")
    assert cli(runner_env, repo.root, "report").exit_code == 0
    assert (repo.root / "reports" / ".gitignore").read_text() == "# mine\n"


def test_a_failed_run_says_what_to_commit(tmp_path, runner_env):
    phases = gpu_phases()
    phases[0]["gates"] = [{"name": "check", "kind": "verify", "run": "exit 1"}]
    repo = make_repo(tmp_path / "repo", phases)
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 1
    assert "commit plans/demo.md and the report together to keep this verdict" in result.stderr
