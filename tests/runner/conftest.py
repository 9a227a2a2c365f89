"""Fixtures shared by the runner's tests (helper functions stay in ``repo_fixtures``,
``run_samples``, ``plan_samples`` and ``gate_helpers``)."""

from __future__ import annotations

import pytest

from runner import machine as machine_module
from tests.runner.repo_fixtures import fake_machine


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
