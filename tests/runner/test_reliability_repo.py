"""``runner advance`` against a busy lock, awkward git states and tampered results: a clear
one-line message, exit code 2, and nothing changed."""

from __future__ import annotations

import json
import threading
import time

import pytest

from runner.errors import ExitCode
from runner.plan.load import load_plan
from runner.repo.lock import repo_lock
from tests.runner.repo_fixtures import (
    cli,
    copy_without_git,
    make_repo,
    snapshot,
    write,
)


def assert_one_error_line(result, *needles: str) -> None:
    assert result.exit_code == ExitCode.USAGE, result.text
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("runner: error: "), result.stderr
    assert "Traceback" not in result.text
    for needle in needles:
        assert needle in errors[0]


# --- two runners --------------------------------------------------------------------------------


def test_second_runner_names_the_holder_and_touches_nothing(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    before, head = snapshot(repo.root), repo.head()
    with repo_lock(repo.root, "runner advance"):
        result = cli(runner_env, repo.root, "advance")
    assert_one_error_line(result, "another runner (pid", "'runner advance'", "since 20")
    assert snapshot(repo.root) == before and repo.head() == head


def test_wait_gets_the_lock_once_the_holder_is_done(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    held, release = threading.Event(), threading.Event()

    def hold():
        with repo_lock(repo.root, "runner advance"):
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    threading.Timer(0.6, release.set).start()
    started = time.monotonic()
    result = cli(runner_env, repo.root, "advance", "--wait", "10")
    holder.join()
    assert result.exit_code == 0, result.text
    assert time.monotonic() - started >= 0.5
    assert repo.commit_count() == 2


def test_wait_gives_up_after_its_timeout(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    before = snapshot(repo.root)
    with repo_lock(repo.root, "runner advance"):
        started = time.monotonic()
        result = cli(runner_env, repo.root, "advance", "--wait", "0.5")
        waited = time.monotonic() - started
    assert_one_error_line(result, "another runner (pid", "gave up after waiting")
    assert 0.4 <= waited < 5
    assert snapshot(repo.root) == before


def test_base_is_read_under_the_lock(tmp_path, runner_env):
    """A runner that waited for another one checkpoints on top of that one's commit."""
    repo = make_repo(tmp_path / "repo")
    held, release = threading.Event(), threading.Event()

    def hold_and_commit():
        with repo_lock(repo.root, "runner advance"):
            held.set()
            release.wait(10)
            write(repo.root, "unrelated.txt", "committed meanwhile\n")
            repo.git("commit", "-q", "-am", "meanwhile")

    holder = threading.Thread(target=hold_and_commit)
    holder.start()
    held.wait(5)
    threading.Timer(0.3, release.set).start()
    result = cli(runner_env, repo.root, "advance", "--wait", "10")
    holder.join()
    assert result.exit_code == 0, result.text
    meanwhile = repo.git("rev-parse", "HEAD~1").strip()
    assert load_plan(repo.plan).plan.phase("alpha").checkpoint.base == meanwhile


# --- git states -----------------------------------------------------------------------------------


def _detach(repo):
    repo.git("checkout", "-q", "--detach", "HEAD")


def _merge_in_progress(repo):
    (repo.root / ".git" / "MERGE_HEAD").write_text(repo.head() + "\n")


def _rebase_in_progress(repo):
    (repo.root / ".git" / "rebase-merge").mkdir()


def _no_identity(repo):
    repo.git("config", "--unset", "user.name")
    repo.git("config", "--unset", "user.email")


@pytest.mark.parametrize(
    ("spoil", "needles"),
    [
        (_detach, ["HEAD is detached", "git switch"]),
        (_merge_in_progress, ["a merge is in progress", "finish or abort it"]),
        (_rebase_in_progress, ["a rebase is in progress"]),
        (_no_identity, ["no git identity configured", "git config user.name"]),
    ],
    ids=["detached", "merge", "rebase", "no-identity"],
)
def test_git_states_that_cannot_take_a_checkpoint(tmp_path, runner_env, spoil, needles):
    repo = make_repo(tmp_path / "repo")
    spoil(repo)
    before, head = snapshot(repo.root), repo.head()
    result = cli(runner_env, repo.root, "advance")
    assert_one_error_line(result, *needles)
    assert snapshot(repo.root) == before and repo.head() == head
    assert not (repo.root / ".git" / "runner.lock").exists()


def test_repository_without_commits(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", git_init=False)
    repo.git("init", "-q", "-b", "main")
    repo.git("config", "user.name", "Test Person")
    repo.git("config", "user.email", "test@example.com")
    before = snapshot(repo.root)
    result = cli(runner_env, repo.root, "advance")
    assert_one_error_line(result, "has no commit yet")
    assert snapshot(repo.root) == before


def test_failing_pre_commit_hook_neither_blocks_nor_corrupts(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    hook = repo.root / ".git" / "hooks" / "pre-commit"
    hook.parent.mkdir(parents=True, exist_ok=True)
    hook.write_text("#!/bin/sh\necho hook ran >> hook.log\nexit 1\n")
    hook.chmod(0o755)
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 0, result.text
    assert repo.commit_count() == 2 and not (repo.root / "hook.log").exists()
    assert repo.git("fsck", "--no-progress").strip() == ""
    assert repo.git("show", "HEAD:plans/demo.md") == repo.plan.read_text()


def test_untracked_plan_is_committed_with_the_checkpoint(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    repo.git("rm", "-q", "--cached", "plans/demo.md")
    repo.git("commit", "-q", "-m", "untrack the plan")
    assert "?? plans/demo.md" in repo.porcelain()
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 0, result.text
    assert repo.git("show", "HEAD:plans/demo.md") == repo.plan.read_text()
    assert "plans/" not in repo.porcelain()


def test_staged_unrelated_changes_stay_staged_and_out_of_the_checkpoint(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    write(repo.root, "unrelated.txt", "staged edit\n")
    repo.git("add", "unrelated.txt")
    write(repo.root, "scratch.txt", "untracked\n")
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 0, result.text
    committed = repo.git("diff-tree", "--no-commit-id", "--name-only", "-r", "HEAD").split()
    assert "unrelated.txt" not in committed and "scratch.txt" not in committed
    porcelain = repo.porcelain()
    assert "M  unrelated.txt" in porcelain and "?? scratch.txt" in porcelain
    assert (repo.root / "unrelated.txt").read_text() == "staged edit\n"


# --- tampered results -------------------------------------------------------------------------------


@pytest.fixture
def host_results(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    host = copy_without_git(repo.root, tmp_path / "host")
    made = cli(runner_env, host, "gate", "alpha", "--out", "results.json")
    assert made.exit_code == 0, made.text
    return repo, host / "results.json"


@pytest.mark.parametrize("schema", [0, 2, "1", None])
def test_results_of_another_schema_are_refused(host_results, runner_env, schema):
    repo, results = host_results
    data = json.loads(results.read_text())
    data["results_schema"] = schema
    results.write_text(json.dumps(data))
    before = snapshot(repo.root)
    result = cli(runner_env, repo.root, "advance", "--results", str(results))
    assert_one_error_line(result, "unknown results_schema", "this runner reads results_schema 1")
    assert snapshot(repo.root) == before and repo.commit_count() == 1


def test_results_with_a_nan_metric_recorded_pass_are_refused(host_results, runner_env):
    repo, results = host_results
    text = results.read_text().replace('"speedup": 2.5', '"speedup": NaN')
    assert "NaN" in text
    results.write_text(text)
    result = cli(runner_env, repo.root, "advance", "--results", str(results))
    assert_one_error_line(result, "refusing to checkpoint alpha", "speedup")
    assert repo.commit_count() == 1


def test_results_claiming_a_pass_their_gates_do_not_give_are_refused(host_results, runner_env):
    repo, results = host_results
    data = json.loads(results.read_text())
    data["phases"][0]["gates"][1]["outcome"] = "FAIL"
    data["phases"][0]["outcome"] = "PASS"
    results.write_text(json.dumps(data))
    result = cli(runner_env, repo.root, "advance", "--results", str(results))
    assert_one_error_line(result, "does not follow from its gates")
    assert repo.commit_count() == 1
