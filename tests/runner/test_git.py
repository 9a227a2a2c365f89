"""The one git layer: queries, the refusals made before a checkpoint, and no hooks."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.errors import GitError
from runner.repo import git as gitlayer
from tests.runner.repo_fixtures import git, make_repo, write

pytestmark = pytest.mark.usefixtures("runner_env")  # isolated git config, no identity


def new_repo(root: Path, *, identity: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    if identity:
        git(root, "config", "user.name", "Test Person")
        git(root, "config", "user.email", "test@example.com")
    write(root, "plan.md", "status: pending\n")
    git(root, "add", "-A")
    if identity:
        git(root, "commit", "-q", "-m", "base")
    return root


def test_not_a_work_tree_top(tmp_path):
    with pytest.raises(GitError, match="not a git repository"):
        gitlayer.check_work_tree(tmp_path)
    with pytest.raises(GitError, match="does not exist"):
        gitlayer.check_work_tree(tmp_path / "missing")
    root = new_repo(tmp_path / "repo")
    (root / "sub").mkdir()
    with pytest.raises(GitError, match="not the top folder of its repository"):
        gitlayer.check_work_tree(root / "sub")
    gitlayer.check_work_tree(root)


def test_detached_head_is_refused(tmp_path):
    root = new_repo(tmp_path / "repo")
    git(root, "checkout", "-q", "--detach")
    with pytest.raises(GitError, match="HEAD is detached"):
        gitlayer.check_ready(root)


def test_merge_in_progress_is_refused(tmp_path):
    root = new_repo(tmp_path / "repo")
    (gitlayer.git_dir(root) / "MERGE_HEAD").write_text(gitlayer.head(root) + "\n")
    with pytest.raises(GitError, match="a merge is in progress"):
        gitlayer.check_ready(root)


def test_missing_identity_is_refused_and_the_environment_is_enough(tmp_path, monkeypatch):
    root = new_repo(tmp_path / "repo", identity=False)
    assert gitlayer.head(root) is None  # no commit yet
    with pytest.raises(GitError, match="no git identity configured"):
        gitlayer.check_ready(root)
    monkeypatch.setenv("GIT_AUTHOR_NAME", "Env Person")
    monkeypatch.setenv("GIT_COMMITTER_NAME", "Env Person")
    monkeypatch.setenv("EMAIL", "env@example.com")
    gitlayer.check_ready(root)


def test_queries(tmp_path):
    root = new_repo(tmp_path / "repo")
    head = gitlayer.head(root)
    git(root, "tag", "-a", "-m", "t", "demo/alpha")
    assert gitlayer.tag_commit(root, "demo/alpha") == head
    assert gitlayer.tag_commit(root, "demo/missing") is None
    assert gitlayer.current_branch(root) == "refs/heads/main"
    assert gitlayer.blob(root, "HEAD", "plan.md") == b"status: pending\n"
    assert gitlayer.blob(root, "HEAD", "nothing.md") is None


def test_is_tracked_is_literal_and_sees_deleted_files(tmp_path):
    repo = make_repo(tmp_path / "repo")
    assert gitlayer.is_tracked(repo.root, "src/code.py") and gitlayer.is_tracked(repo.root, "src")
    (repo.root / "src" / "code.py").unlink()
    assert gitlayer.is_tracked(repo.root, "src/code.py")  # deleted but still in the index
    assert not gitlayer.is_tracked(repo.root, "src/*.py")
    assert not gitlayer.is_tracked(repo.root, "nothing-here")


def test_no_hook_runs_for_the_runners_git_calls(tmp_path, monkeypatch):
    """A post-index-change hook (here through core.hooksPath) runs on every index write; the
    runner's own git calls run none, so no hook can edit the tree under a checkpoint."""
    root = new_repo(tmp_path / "repo")
    hooks = tmp_path / "hooks"
    write(hooks, "post-index-change", "#!/bin/sh\necho ran >> \"$HOOK_LOG\"\n").chmod(0o755)
    git(root, "config", "core.hooksPath", str(hooks))
    log = tmp_path / "hook.log"
    monkeypatch.setenv("HOOK_LOG", str(log))
    write(root, "plan.md", "status: complete\n")
    gitlayer.run_git(root, "add", "plan.md")
    assert not log.exists()
    git(root, "reset", "-q")  # the same index write through plain git runs the hook
    git(root, "add", "plan.md")
    assert log.read_text().splitlines()[-1] == "ran"


def test_is_ignored_reads_the_gitignore(tmp_path):
    repo = make_repo(tmp_path / "repo")  # its .gitignore holds /ignored/
    assert gitlayer.is_ignored(repo.root, "ignored/x") and gitlayer.is_ignored(repo.root, "ignored/*")
    assert not gitlayer.is_ignored(repo.root, "src/code.py")
