"""``runner history``: runs from reports/, checkpoints from the plan and its tags; reads only."""

from __future__ import annotations

import json

import pytest

from runner.errors import UsageError
from runner.views.history import resolve_run
from runner.views.runs import find_runs, latest_runs
from runner.workspace import open_workspace
from tests.runner.repo_fixtures import (
    cli,
    make_repo,
    snapshot,
    write,
)
from tests.runner.run_samples import REAL_RESULTS, SAMPLE_ROOT, check_run


def test_finds_the_real_kernel_run_of_the_shipped_plan():
    scan = find_runs(SAMPLE_ROOT, "mla-verify", "kernel")
    [run] = [run for run in scan.runs if run.path == REAL_RESULTS]
    assert run.phase == "kernel" and run.outcome == "FAIL"
    assert run.machine.gpu_name == "NVIDIA H200"
    assert run.metrics()[("kernel", "benchmark", "min_speedup_64k")] == 6.85


def test_runs_are_listed_oldest_first_and_unreadable_ones_reported(tmp_path):
    repo = make_repo(tmp_path / "repo", git_init=False)
    check_run(repo.root, "20261202T000000Z-bbbbbbbb", "2026-12-02T00:00:00Z", 2.0)
    check_run(repo.root, "20261201T000000Z-aaaaaaaa", "2026-12-01T00:00:00Z", 1.2)
    write(repo.root, "reports/demo/alpha/broken/results.json", "{not json")
    scan = find_runs(repo.root, "demo")
    assert [run.run_id for run in scan.runs] == ["20261201T000000Z-aaaaaaaa", "20261202T000000Z-bbbbbbbb"]
    assert [run.outcome for run in scan.runs] == ["FAIL", "PASS"]
    assert len(scan.skipped) == 1 and "not valid JSON" in scan.skipped[0]
    assert latest_runs(scan)["alpha"].run_id == "20261202T000000Z-bbbbbbbb"


def test_history_lists_runs_and_the_checkpoint_with_its_commit(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    assert cli(runner_env, repo.root, "advance").exit_code == 0  # checkpoint demo/alpha
    check_run(repo.root, "20991201T000000Z-cccccccc", "2099-12-01T00:00:00Z", 1.0)
    before = snapshot(repo.root)
    result = cli(runner_env, repo.root, "history")
    assert result.exit_code == 0, result.text
    lines = result.stdout.splitlines()
    runs = [line for line in lines if line.startswith("  alpha  ")]
    assert len(runs) == 3  # the checkpoint's run + the synthetic one, then the checkpoint row
    assert "PASS" in runs[0] and "20991201T000000Z-cccccccc" in runs[1] and "FAIL" in runs[1]
    assert "testhost: no GPU" in runs[0]
    assert "demo/alpha" in runs[2] and repo.head()[:12] in runs[2]
    assert snapshot(repo.root) == before


def test_history_json_and_phase_filter(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", git_init=False)
    check_run(repo.root, "20261201T000000Z-aaaaaaaa", "2026-12-01T00:00:00Z", 2.0)
    result = cli(runner_env, repo.root, "history", "alpha", "--json")
    assert result.exit_code == 0, result.text
    data = json.loads(result.stdout)
    [run] = data["runs"]
    assert run["run_id"] == "20261201T000000Z-aaaaaaaa" and run["outcome"] == "PASS"
    assert run["machine_fingerprint"].startswith("sha256:")
    assert run["path"] == "reports/demo/alpha/20261201T000000Z-aaaaaaaa/results.json"
    assert data["checkpoints"] == []
    beta = json.loads(cli(runner_env, repo.root, "history", "beta", "--json").stdout)
    assert beta["runs"] == []


def test_history_of_an_unknown_phase_is_a_usage_error(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", git_init=False)
    result = cli(runner_env, repo.root, "history", "nope")
    assert result.exit_code == 2
    assert "no phase 'nope'" in result.stderr and "alpha" in result.stderr


def test_resolve_run_by_id_prefix_path_and_folder(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", git_init=False)
    first = check_run(repo.root, "20261201T000000Z-aaaaaaaa", "2026-12-01T00:00:00Z", 2.0)
    check_run(repo.root, "20261201T000500Z-bbbbbbbb", "2026-12-01T00:05:00Z", 2.0)
    ws = open_workspace(None, cwd=repo.root)
    assert resolve_run(ws, "20261201T000000Z-aaaaaaaa", cwd=repo.root).path == first
    assert resolve_run(ws, "20261201T0000", cwd=repo.root).path == first
    assert resolve_run(ws, str(first), cwd=repo.root).path == first
    assert resolve_run(ws, str(first.parent), cwd=repo.root).phase == "alpha"
    with pytest.raises(UsageError, match="names 2 runs"):
        resolve_run(ws, "20261201T", cwd=repo.root)
    with pytest.raises(UsageError, match="not a results file"):
        resolve_run(ws, "nothing-like-this", cwd=repo.root)
    with pytest.raises(UsageError, match="no checkpoint yet"):
        resolve_run(ws, "demo/alpha", cwd=repo.root)
