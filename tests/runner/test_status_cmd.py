"""``runner status``: reads only; plain text off a terminal, JSON with ``--json``."""

from __future__ import annotations

import json

from tests.runner.repo_fixtures import (
    cli,
    copy_without_git,
    make_repo,
    snapshot,
)


def test_status_of_a_fresh_plan(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    before, status = snapshot(repo.root), repo.porcelain()
    result = cli(runner_env, repo.root, "status")
    assert result.exit_code == 0, result.text
    assert "-> alpha: pending" in result.stdout and "   beta: pending" in result.stdout
    assert "next: alpha" in result.stdout
    assert snapshot(repo.root) == before and repo.porcelain() == status


def test_status_json_after_a_checkpoint(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    assert cli(runner_env, repo.root, "advance").exit_code == 0
    before, status = snapshot(repo.root), repo.porcelain()
    result = cli(runner_env, repo.root, "status", "--json")
    assert result.exit_code == 0, result.text
    data = json.loads(result.stdout)
    assert data["plan"]["id"] == "demo" and data["next"] == "beta"
    alpha, beta = data["phases"]
    assert alpha["status"] == "complete" and not alpha["next"] and beta["next"]
    record = alpha["checkpoint"]
    assert record["tag"] == "demo/alpha"
    assert record["commit"] == repo.head()  # resolved from the tag
    assert record["metrics"] == {"speedup": 2.5, "errors": 0}
    assert record["time"].endswith("Z")
    assert beta["checkpoint"] is None
    text = cli(runner_env, repo.root, "status").stdout
    assert f"commit {repo.head()[:12]}" in text and "speedup=2.5" in text
    assert snapshot(repo.root) == before and repo.porcelain() == status


def test_status_without_git_has_no_commit(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    assert cli(runner_env, repo.root, "advance").exit_code == 0
    host = copy_without_git(repo.root, tmp_path / "host")
    data = json.loads(cli(runner_env, host, "status", "--json").stdout)
    assert data["phases"][0]["checkpoint"]["commit"] is None


def test_broken_plan_is_a_one_line_error(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    repo.plan.write_text("---\nschema: 1\nid: demo\nphases: [\n---\n")
    result = cli(runner_env, repo.root, "status")
    assert result.exit_code == 2
    assert result.stderr.startswith("runner: error:") and len(result.stderr.splitlines()) == 1
    assert "demo.md" in result.stderr and "Traceback" not in result.text
