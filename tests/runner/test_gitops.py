"""Checkpoint commits in throwaway repositories: exactly the given paths, nothing else touched."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from runner.errors import GitError
from runner.gitops import CheckpointRepo
from tests.runner.repo_fixtures import git, write


pytestmark = pytest.mark.usefixtures("runner_env")  # isolated git config, no identity


def new_repo(root: Path, *, identity: bool = True, commit: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    if identity:
        git(root, "config", "user.name", "Test Person")
        git(root, "config", "user.email", "test@example.com")
    if commit:
        write(root, "plan.md", "status: pending\n")
        write(root, "kernel/a.py", "a = 1\n")
        write(root, "kernel/old.py", "old = 1\n")
        write(root, "other.txt", "other\n")
        write(root, "staged.txt", "staged v1\n")
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", "base")
    return root


def state(root: Path) -> dict[str, str]:
    """Everything a failed checkpoint must leave as it was."""
    return {
        "head": git(root, "rev-parse", "HEAD", check=False),
        "refs": git(root, "for-each-ref"),
        "status": git(root, "status", "--porcelain=v1", "-uall"),
        "index": git(root, "ls-files", "-s"),
        "cached-diff": git(root, "diff", "--cached"),
        "diff": git(root, "diff"),
    }


MESSAGE = """\
runner: checkpoint phase kernel

Gates: build, verify, bench

Runner-Phase: kernel
Runner-Fingerprint: sha256:abc
"""


def test_commits_exactly_the_given_paths(tmp_path):
    root = new_repo(tmp_path / "repo")
    base = git(root, "rev-parse", "HEAD").strip()
    write(root, "plan.md", "status: complete\n")        # listed file, modified
    write(root, "kernel/a.py", "a = 2\n")                # inside a listed folder
    write(root, "kernel/new.py", "new = 1\n")            # new, inside a listed folder
    (root / "kernel/old.py").unlink()                    # deleted, inside a listed folder
    write(root, "staged.txt", "staged v2\n")             # unrelated, staged
    git(root, "add", "staged.txt")
    write(root, "other.txt", "other, unstaged edit\n")   # unrelated, unstaged
    write(root, "untracked.txt", "u\n")                  # unrelated, untracked
    write(root, "kernel/a.py", "a = 2\n")

    sha = CheckpointRepo(root).checkpoint(
        ["plan.md", "kernel"], MESSAGE, "runner/kernel", "checkpoint of phase kernel"
    )

    assert git(root, "rev-parse", "HEAD").strip() == sha
    assert git(root, "rev-parse", "HEAD^").strip() == base
    changed = git(root, "diff-tree", "--no-commit-id", "--name-status", "-r", base, sha)
    assert sorted(changed.splitlines()) == sorted(
        ["M\tplan.md", "M\tkernel/a.py", "A\tkernel/new.py", "D\tkernel/old.py"]
    )
    status = git(root, "status", "--porcelain=v1", "-uall").splitlines()
    assert sorted(status) == sorted(["M  staged.txt", " M other.txt", "?? untracked.txt"])
    assert git(root, "show", ":staged.txt") == "staged v2\n"  # still staged, same content
    assert (root / "other.txt").read_text() == "other, unstaged edit\n"
    assert git(root, "symbolic-ref", "HEAD").strip() == "refs/heads/main"


def test_message_trailers_and_tag(tmp_path):
    root = new_repo(tmp_path / "repo")
    write(root, "plan.md", "status: complete\n")
    repo = CheckpointRepo(root)
    sha = repo.checkpoint(["plan.md"], MESSAGE, "runner/kernel", "phase kernel\n\n# kept\n")
    assert repo.commit_message(sha) == MESSAGE
    assert git(root, "log", "-1", "--format=%B", sha).strip() == MESSAGE.strip()
    stored = git(root, "cat-file", "commit", sha).partition("\n\n")[2]
    trailers = subprocess.run(["git", "interpret-trailers", "--parse"], input=stored,
                              capture_output=True, text=True, cwd=root).stdout
    assert trailers.splitlines() == ["Runner-Phase: kernel", "Runner-Fingerprint: sha256:abc"]
    assert repo.tag_commit("runner/kernel") == sha
    assert git(root, "cat-file", "-t", "runner/kernel").strip() == "tag"
    assert "# kept" in git(root, "cat-file", "tag", "runner/kernel")
    assert repo.tag_commit("runner/missing") is None
    assert repo.head() == sha


def test_existing_tag_is_refused_never_moved(tmp_path):
    root = new_repo(tmp_path / "repo")
    repo = CheckpointRepo(root)
    write(root, "plan.md", "one\n")
    first = repo.checkpoint(["plan.md"], "one", "runner/p", "one")
    write(root, "plan.md", "two\n")
    before = state(root)
    with pytest.raises(GitError, match="already exists"):
        repo.checkpoint(["plan.md"], "two", "runner/p", "two")
    assert repo.tag_commit("runner/p") == first and state(root) == before


def test_signing_configuration_does_not_sign_or_prompt(tmp_path):
    root = new_repo(tmp_path / "repo")
    git(root, "config", "tag.gpgSign", "true")
    git(root, "config", "gpg.program", "false")
    write(root, "plan.md", "one\n")
    sha = CheckpointRepo(root).checkpoint(["plan.md"], "one", "runner/s", "one")
    assert CheckpointRepo(root).tag_commit("runner/s") == sha


def test_first_commit_in_an_empty_repository(tmp_path):
    root = new_repo(tmp_path / "repo", commit=False)
    write(root, "plan.md", "x\n")
    write(root, "notes.txt", "not committed\n")
    repo = CheckpointRepo(root)
    assert repo.head() is None
    sha = repo.checkpoint(["plan.md"], "first", "runner/first", "first")
    assert repo.head() == sha
    assert git(root, "ls-tree", "-r", "--name-only", sha).split() == ["plan.md"]
    assert git(root, "rev-list", "--count", "HEAD").strip() == "1"
    assert git(root, "status", "--porcelain=v1").splitlines() == ["?? notes.txt"]


def test_hooks_do_not_run(tmp_path):
    root = new_repo(tmp_path / "repo")
    hook = root / ".git/hooks/pre-commit"
    hook.parent.mkdir(exist_ok=True)
    hook.write_text("#!/bin/sh\necho hook ran > hook-ran.txt\nexit 1\n")
    hook.chmod(0o755)
    write(root, "plan.md", "done\n")
    sha = CheckpointRepo(root).checkpoint(["plan.md"], "cp", "runner/x", "x")
    assert CheckpointRepo(root).head() == sha
    assert not (root / "hook-ran.txt").exists()


def test_failed_checkpoint_leaves_everything_as_it_was(tmp_path):
    root = new_repo(tmp_path / "repo")
    write(root, "plan.md", "changed\n")
    write(root, "staged.txt", "staged v2\n")
    git(root, "add", "staged.txt")
    before = state(root)
    with pytest.raises(GitError, match="git add failed") as info:
        CheckpointRepo(root).checkpoint(["plan.md", "no/such/path"], "m", "runner/t", "t")
    assert "no/such/path" in str(info.value)
    assert state(root) == before
    assert not list((root / ".git").glob("runner-*"))


def test_failed_tag_undoes_the_commit(tmp_path):
    root = new_repo(tmp_path / "repo")
    write(root, "plan.md", "changed\n")
    before = state(root)
    (root / ".git/refs/tags/runner").mkdir(parents=True)
    (root / ".git/refs/tags/runner/t.lock").write_text("")  # someone else is writing the tag
    with pytest.raises(GitError, match="tagging the checkpoint failed"):
        CheckpointRepo(root).checkpoint(["plan.md"], "m", "runner/t", "t")
    assert state(root) == before


def test_failed_tag_in_empty_repository_leaves_it_unborn(tmp_path):
    root = new_repo(tmp_path / "repo", commit=False)
    write(root, "plan.md", "x\n")
    (root / ".git/refs/tags").mkdir(parents=True, exist_ok=True)
    (root / ".git/refs/tags/t.lock").write_text("")
    with pytest.raises(GitError):
        CheckpointRepo(root).checkpoint(["plan.md"], "m", "t", "t")
    assert CheckpointRepo(root).head() is None


def test_invalid_tag_name_is_refused_before_committing(tmp_path):
    root = new_repo(tmp_path / "repo")
    write(root, "plan.md", "changed\n")
    before = state(root)
    with pytest.raises(GitError, match="not a valid git tag name"):
        CheckpointRepo(root).checkpoint(["plan.md"], "m", "bad..tag", "t")
    assert state(root) == before


def test_not_a_repository(tmp_path):
    with pytest.raises(GitError, match="not a git repository"):
        CheckpointRepo(tmp_path)
    with pytest.raises(GitError, match="does not exist"):
        CheckpointRepo(tmp_path / "missing")
    root = new_repo(tmp_path / "repo")
    (root / "sub").mkdir()
    with pytest.raises(GitError, match="not a git repository"):
        CheckpointRepo(root / "sub")


def test_detached_head_is_refused(tmp_path):
    root = new_repo(tmp_path / "repo")
    git(root, "checkout", "-q", "--detach")
    write(root, "plan.md", "changed\n")
    before = state(root)
    with pytest.raises(GitError, match="HEAD is detached"):
        CheckpointRepo(root).checkpoint(["plan.md"], "m", "t", "t")
    assert state(root) == before


def test_merge_in_progress_is_refused(tmp_path):
    root = new_repo(tmp_path / "repo")
    git(root, "checkout", "-q", "-b", "side")
    write(root, "other.txt", "side\n")
    git(root, "commit", "-q", "-am", "side")
    git(root, "checkout", "-q", "main")
    write(root, "other.txt", "main\n")
    git(root, "commit", "-q", "-am", "main")
    git(root, "merge", "side", check=False)  # conflicts, stops mid-merge
    assert (root / ".git/MERGE_HEAD").exists()
    with pytest.raises(GitError, match="a merge is in progress"):
        CheckpointRepo(root).checkpoint(["plan.md"], "m", "t", "t")


def test_missing_identity_is_refused(tmp_path):
    root = new_repo(tmp_path / "repo", identity=False, commit=False)
    write(root, "plan.md", "x\n")
    with pytest.raises(GitError, match="no git identity configured"):
        CheckpointRepo(root).checkpoint(["plan.md"], "m", "t", "t")
    assert CheckpointRepo(root).head() is None


def test_identity_from_environment_is_enough(tmp_path, monkeypatch):
    root = new_repo(tmp_path / "repo", identity=False, commit=False)
    monkeypatch.setenv("GIT_AUTHOR_NAME", "Env Person")
    monkeypatch.setenv("GIT_COMMITTER_NAME", "Env Person")
    monkeypatch.setenv("EMAIL", "env@example.com")
    write(root, "plan.md", "x\n")
    sha = CheckpointRepo(root).checkpoint(["plan.md"], "m", "t", "t")
    assert git(root, "log", "-1", "--format=%an <%ae>", sha).strip() == "Env Person <env@example.com>"


def test_no_git_processes_leak(tmp_path):
    root = new_repo(tmp_path / "repo")
    repo = CheckpointRepo(root)
    write(root, "plan.md", "changed\n")
    repo.checkpoint(["plan.md"], "m", "t", "t")
    repo.head()
    children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
    if children.exists():
        for pid in children.read_text().split():
            assert "git" not in Path(f"/proc/{pid}/comm").read_text()
