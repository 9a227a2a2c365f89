"""Fixtures shared by the runner's tests (helper functions stay in ``repo_fixtures``,
``run_samples``, ``plan_samples`` and ``gate_helpers``)."""

from __future__ import annotations

import pytest

from runner.records import machine as machine_module
from tests.runner.repo_fixtures import cli, copy_without_git, fake_machine, gpu_phases, make_repo


@pytest.fixture
def runner_env(monkeypatch, tmp_path):
    """Isolated git config, ``RUNNER_DEVICES=cpu`` and a fast fake machine probe."""
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "no-global-gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME",
                "GIT_COMMITTER_EMAIL", "EMAIL", "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RUNNER_DEVICES", "cpu")
    monkeypatch.setattr(machine_module, "probe_machine", fake_machine)
    return monkeypatch


@pytest.fixture
def gpu_results(tmp_path, runner_env):
    """A repository whose phase needs cuda, and results made by ``runner gate --out`` on a
    copy of it without ``.git`` (the GPU host)."""
    repo = make_repo(tmp_path / "repo", gpu_phases())
    host = copy_without_git(repo.root, tmp_path / "gpuhost")
    runner_env.setenv("RUNNER_DEVICES", "cpu,cuda")
    made = cli(runner_env, host, "gate", "alpha", "--out", "results.json")
    runner_env.setenv("RUNNER_DEVICES", "cpu")
    assert made.exit_code == 0, made.text
    assert not (host / ".git").exists()
    return repo, host / "results.json"
