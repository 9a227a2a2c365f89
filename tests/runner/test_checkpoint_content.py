"""A checkpoint commits what the gates tested and nothing else: an edit after the last
fingerprint, or a hook run by the runner's own git calls, never reaches the commit; paths that
several phases list are committed by whichever phase checkpoints."""

from __future__ import annotations

import pytest

from runner.plan.load import load_plan
from runner.records.run_folder import read_run_meta
from runner.repo import checkpoint as cp
from tests.runner.repo_fixtures import cli, default_phases, gate, make_repo, write


@pytest.fixture(autouse=True)
def no_fault_hook():
    yield
    cp.set_fault_hook(None)


def _status(repo, phase="alpha"):
    return load_plan(repo.plan).plan.phase(phase).status


@pytest.mark.parametrize("edit, problem", [
    (lambda root: write(root, "src/code.py", "VALUE = 666  # untested\n"), "src/code.py changed"),
    (lambda root: write(root, "src/late.py", "LATE = 1\n"), "src/late.py is not in the tested tree"),
    (lambda root: (root / "src" / "code.py").unlink(), "src/code.py was removed"),
], ids=["edited", "created", "removed"])
def test_an_edit_after_the_last_fingerprint_is_refused(tmp_path, runner_env, edit, problem):
    """The edit lands between the gates' final fingerprint and the commit's tree (the first
    checkpoint step); the commit would have held it as if tested."""
    repo = make_repo(tmp_path / "repo")
    head = repo.head()
    cp.set_fault_hook(lambda step: edit(repo.root) if step == "blob" else None)

    result = cli(runner_env, repo.root, "advance")

    assert result.exit_code == 2, result.text
    assert "changed after the gates' last fingerprint" in result.stderr and problem in result.stderr
    assert repo.head() == head and repo.git("tag", "--list") == ""
    assert _status(repo) == "pending"  # the plan was not changed
    [run_dir] = (repo.root / "reports" / "demo" / "alpha").iterdir()
    meta = read_run_meta(run_dir)
    assert not meta.recorded and "checkpoint was refused" in meta.reason
    assert (run_dir / ".gitignore").read_text().splitlines()[-1] == "*"


def test_a_hook_of_the_runners_own_git_calls_cannot_edit_the_commit(tmp_path, runner_env):
    """A post-index-change hook (set through core.hooksPath) that edits a tracked file of the
    phase whenever an index is written: the runner's git calls run no hook."""
    repo = make_repo(tmp_path / "repo")
    hooks = tmp_path / "hooks"
    write(hooks, "post-index-change", f"#!/bin/sh\necho 'VALUE = 666' > '{repo.root}/src/code.py'\n").chmod(0o755)
    repo.git("config", "core.hooksPath", str(hooks))

    result = cli(runner_env, repo.root, "advance")

    assert result.exit_code == 0, result.text
    assert repo.git("show", "HEAD:src/code.py") == "VALUE = 1\n"
    assert (repo.root / "src" / "code.py").read_text() == "VALUE = 1\n"


def overlapping_phases():
    """Three phases listing ``src/engine/`` (as backend, cudagraph and defrag list serving/engine/)."""
    return [
        {"id": name, "title": name, "status": "pending", "paths": ["src/engine/", f"src/{name}/"],
         "gates": [gate("check", "verify", "true")]}
        for name in ("backend", "cudagraph", "defrag")
    ]


def test_paths_several_phases_list_are_committed_by_each_phase(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", overlapping_phases())
    write(repo.root, "src/engine/step.py", "STEP = 'eager'\n")
    write(repo.root, "src/backend/b.py", "B = 1\n")
    assert cli(runner_env, repo.root, "advance").exit_code == 0

    write(repo.root, "src/engine/step.py", "STEP = 'graph'\n")  # cudagraph's change to a shared path
    write(repo.root, "src/cudagraph/c.py", "C = 1\n")
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 0, result.text
    committed = set(repo.git("diff-tree", "--no-commit-id", "--name-only", "-r", "HEAD").split())
    assert {"src/engine/step.py", "src/cudagraph/c.py"} <= committed
    assert repo.git("show", "demo/cudagraph:src/engine/step.py") == "STEP = 'graph'\n"
    assert repo.git("show", "demo/backend:src/engine/step.py") == "STEP = 'eager'\n"

    write(repo.root, "src/engine/step.py", "STEP = 'compact'\n")
    assert cli(runner_env, repo.root, "advance").exit_code == 0
    assert repo.git("show", "demo/defrag:src/engine/step.py") == "STEP = 'compact'\n"
    assert repo.porcelain() == ""


def test_a_phase_may_list_a_path_twice_or_nested(tmp_path, runner_env):
    phases = default_phases()
    phases[0]["paths"] = ["src/", "src/", "src/deep/", "./src"]
    repo = make_repo(tmp_path / "repo", phases)
    write(repo.root, "src/deep/x.py", "X = 1\n")
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 0, result.text
    assert repo.git("show", "HEAD:src/deep/x.py") == "X = 1\n"
