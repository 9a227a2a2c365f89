"""Where the lock lives in linked worktrees, separate git dirs and submodule-style checkouts,
and files that never count as changes of the tree for its fingerprint."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from runner.repo.fingerprint import fingerprint_files, tree_fingerprint
from runner.repo.lock import lock_path, repo_lock
from tests.runner.repo_fixtures import git, write


@pytest.fixture(autouse=True)
def isolated_git(runner_env):
    """The isolated git config of ``runner_env``, with an identity for the commits here."""
    monkeypatch = runner_env
    monkeypatch.setenv("GIT_AUTHOR_NAME", "T")
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "t@example.com")
    monkeypatch.setenv("GIT_COMMITTER_NAME", "T")
    monkeypatch.setenv("GIT_COMMITTER_EMAIL", "t@example.com")


def repo(root: Path) -> Path:
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    write(root, "src/a.py", "a = 1\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    return root


def plain_copy(root: Path, dest: Path) -> Path:
    shutil.copytree(root, dest, ignore=shutil.ignore_patterns(".git"))
    return dest


def _outside(path: Path, root: Path) -> bool:
    return not path.resolve().is_relative_to(root.resolve())


def test_linked_worktree_lock_is_in_its_git_dir(tmp_path):
    main = repo(tmp_path / "main")
    git(main, "worktree", "add", "-q", str(tmp_path / "wt"), "-b", "side")
    wt = tmp_path / "wt"
    path = lock_path(wt)
    assert _outside(path, wt)
    assert path.parent.resolve() == (main / ".git" / "worktrees" / "wt").resolve()
    copy = plain_copy(wt, tmp_path / "copy")
    with repo_lock(wt, "test"):
        assert path.exists()
        assert tree_fingerprint(wt) == tree_fingerprint(copy)
    assert lock_path(main) != path  # the main work tree's runner is not blocked by this one


def test_separate_git_dir_lock(tmp_path):
    root = tmp_path / "w"
    root.mkdir()
    git(root, "init", "-q", "--separate-git-dir", str(tmp_path / "store.git"))
    assert lock_path(root).parent.resolve() == (tmp_path / "store.git").resolve()


def test_relative_gitdir_file_as_in_a_submodule(tmp_path):
    outer = tmp_path / "outer"
    (outer / ".git" / "modules" / "sub").mkdir(parents=True)
    sub = outer / "sub"
    sub.mkdir()
    (sub / ".git").write_text("gitdir: ../.git/modules/sub\n")
    assert lock_path(sub).resolve() == (outer / ".git" / "modules" / "sub" / "runner.lock").resolve()


def test_no_git_dir_falls_back_and_the_lock_is_not_fingerprinted(tmp_path):
    root = tmp_path / "plain"
    write(root, "src/a.py", "a = 1\n")  # no .gitignore at all
    before = tree_fingerprint(root)
    assert lock_path(root) == root / ".runner.lock"
    with repo_lock(root, "test"):
        (root / ".runner.lock.takeover").write_text("")
        assert tree_fingerprint(root) == before
    (root / ".runner.lock.takeover").unlink()


def test_broken_gitdir_file_falls_back(tmp_path):
    root = tmp_path / "w"
    write(root, ".git", "gitdir: /nonexistent/place\n")
    assert lock_path(root) == root / ".runner.lock"


def test_bytecode_never_counts_as_a_change(tmp_path):
    root = tmp_path / "t"
    write(root, "src/a.py", "a = 1\n")
    write(root, ".gitignore", "*.log\n")  # does not ignore bytecode
    before = tree_fingerprint(root)
    write(root, "src/__pycache__/a.cpython-311.pyc", "bytecode")
    write(root, "src/b.pyc", "bytecode")
    write(root, "__pycache__/x.txt", "anything")
    assert tree_fingerprint(root) == before
    assert not [f for f in fingerprint_files(root) if "pycache" in f or f.endswith(".pyc")]
    write(root, "src/pyc", "a real file")  # only the exact names are left out
    write(root, "src/x.pyc.txt", "a real file")
    assert tree_fingerprint(root) != before
