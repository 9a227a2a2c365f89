"""Checkpoint commits and tags, made with the real git binary.

``CheckpointRepo.checkpoint`` commits exactly the given paths, as they are in the work tree,
on top of ``HEAD`` and nothing else, whatever else is staged or modified. It builds the
commit in a temporary index (``GIT_INDEX_FILE``: ``read-tree HEAD``, ``add -A -- <paths>``,
``write-tree``), creates it with ``commit-tree`` and moves the branch with a compare-and-swap
``update-ref``, then tags it with ``tag -a`` (an existing tag of that name is refused before anything is
written: a checkpoint tag is never moved). Finally the real index entries of the
committed paths are reset to the new commit, so they show as unmodified while every other
staged change stays staged. The work tree is never written.

Decisions:

* Commit hooks (``pre-commit``, ``commit-msg``, ``post-commit``) do not run: the commit is
  made with plumbing commands. The gates are the checks of a checkpoint, and a hook that
  rewrote files would change the tree the gates ran on.
* A detached ``HEAD`` is refused: a checkpoint must land on a branch.
* Paths are literal (``GIT_LITERAL_PATHSPECS``): ``kernel/*.py`` names a file of that name.
  Files ignored by ``.gitignore`` under a committed directory are left out, as with
  ``git add``; naming an ignored file directly is an error.
* If anything fails, ``HEAD``, the index and the work tree are as they were (a failed tag
  moves the branch back), and ``GitError`` carries the tail of git's output.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import git

from runner.errors import GitError

_IN_PROGRESS = {
    "MERGE_HEAD": "a merge",
    "CHERRY_PICK_HEAD": "a cherry-pick",
    "REVERT_HEAD": "a revert",
    "rebase-merge": "a rebase",
    "rebase-apply": "a rebase or git am",
}
_OUTPUT_TAIL_LINES = 20


class CheckpointRepo:
    """The git repository whose top folder is ``root``; raises ``GitError`` if there is none."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        with self._repo() as repo:
            if repo.bare:
                raise GitError(f"{self.root} is a bare repository; the runner needs a work tree")
            top = Path(repo.working_tree_dir or "").resolve()
            if top != self.root.resolve():
                raise GitError(f"{self.root} is not the top folder of its repository ({top})")

    # --- queries ------------------------------------------------------------------------------

    def head(self) -> str | None:
        """The commit ``HEAD`` names, or ``None`` before the first commit."""
        with self._repo() as repo:
            return _rev(repo, "HEAD")

    def tag_commit(self, tag: str) -> str | None:
        """The commit the tag ``tag`` names, or ``None`` when there is no such tag."""
        with self._repo() as repo:
            return _rev(repo, f"refs/tags/{tag}")

    def is_tracked(self, path: str) -> bool:
        """Whether the index tracks ``path`` (a file, or a folder with tracked files); the
        pathspec is literal."""
        with self._repo() as repo:
            return bool(_run(repo, "--literal-pathspecs", "ls-files", "--", path))

    def commit_message(self, sha: str) -> str:
        """The full message of commit ``sha``, byte for byte as stored (trailers included)."""
        with self._repo() as repo:
            raw = _run(repo, "cat-file", "commit", sha, strip=False)
        _, sep, message = raw.partition("\n\n")
        if not sep:
            return ""
        return message

    def check_ready(self) -> None:
        """Raise ``GitError`` unless a checkpoint can be made now.

        Refused: a merge, rebase, cherry-pick, revert or ``git am`` in progress; a detached
        ``HEAD``; no committer identity (``user.name`` / ``user.email`` or the ``GIT_*``
        environment variables).
        """
        with self._repo() as repo:
            git_dir = Path(repo.git_dir)
            for name, what in _IN_PROGRESS.items():
                if (git_dir / name).exists():
                    raise GitError(
                        f"{what} is in progress in {self.root}; finish or abort it before the "
                        "runner checkpoints"
                    )
            try:
                repo.git.symbolic_ref("-q", "HEAD")
            except git.GitCommandError:
                at = _rev(repo, "HEAD")
                raise GitError(
                    f"HEAD is detached (at {at[:12] if at else '?'}); check out a branch "
                    "(git switch <branch>) so the checkpoint commit lands on it"
                ) from None
            missing = _missing_identity(repo)
            if missing:
                raise GitError(
                    f"no git identity configured ({' and '.join(missing)} missing); set it with "
                    "git config user.name 'Your Name' and git config user.email you@example.com"
                )

    # --- the checkpoint -----------------------------------------------------------------------

    def checkpoint(self, paths: Sequence[str], message: str, tag: str, tag_message: str) -> str:
        """Commit exactly ``paths`` (files or folders; new, modified or deleted) on the
        current branch with ``message``, tag the commit ``tag`` (annotated; an existing tag
        of that name is refused before anything is written) and return the commit's sha.

        ``runner advance`` checkpoints through ``runner.checkpoint.make_checkpoint``, which
        also writes the plan last and survives interrupts; this stays for plain commits."""
        paths = [str(path) for path in paths]
        if not paths:
            raise GitError("nothing to checkpoint: no paths given")
        self.check_ready()
        with self._repo() as repo:
            _check_tag_name(repo, tag)
            existing = _rev(repo, f"refs/tags/{tag}")
            if existing is not None:
                raise GitError(
                    f"tag {tag} already exists (at {existing[:12]}); a checkpoint tag is never moved. "
                    f"Delete it (git tag -d {tag}) to checkpoint the phase again"
                )
            git_dir = Path(repo.git_dir)
            stamp = f"{os.getpid()}-{uuid.uuid4().hex}"
            index = git_dir / f"runner-index-{stamp}"
            msg_file = git_dir / f"runner-message-{stamp}"
            scratch_env = {"GIT_INDEX_FILE": str(index), "GIT_LITERAL_PATHSPECS": "1"}
            old = _rev(repo, "HEAD")
            branch = repo.git.symbolic_ref("HEAD")
            try:
                _run(repo, "read-tree", *([old] if old else ["--empty"]), env=scratch_env)
                _run(repo, "add", "-A", "--", *paths, env=scratch_env)
                tree = _run(repo, "write-tree", env=scratch_env)
                msg_file.write_text(_with_newline(message), encoding="utf-8")
                parents = ["-p", old] if old else []
                new = _run(repo, "commit-tree", tree, *parents, "-F", str(msg_file))
                first_line = message.strip().splitlines()[0] if message.strip() else ""
                _run(repo, "update-ref", "-m", f"runner checkpoint: {first_line}",
                     branch, new, old or "")
            finally:
                for scratch in (index, index.with_name(index.name + ".lock"), msg_file):
                    scratch.unlink(missing_ok=True)
            try:
                msg_file.write_text(_with_newline(tag_message), encoding="utf-8")
                _run(repo, "tag", "-a", "--no-sign", "--cleanup=verbatim", "-F", str(msg_file),
                     tag, new)
            except GitError as exc:
                _move_back(repo, branch, new, old)
                raise GitError(f"tagging the checkpoint failed, so it was undone: {exc}") from exc
            finally:
                msg_file.unlink(missing_ok=True)
            try:
                _run(repo, "reset", "-q", new, "--", *paths, env={"GIT_LITERAL_PATHSPECS": "1"})
            except GitError as exc:
                raise GitError(
                    f"checkpoint {new[:12]} was committed and tagged {tag}, but the index "
                    f"could not be updated for its paths ({exc}); run git reset -q -- <paths>"
                ) from exc
            return new

    @contextmanager
    def _repo(self) -> Iterator[git.Repo]:
        try:
            repo = git.Repo(self.root)
        except git.NoSuchPathError:
            raise GitError(f"{self.root} does not exist") from None
        except git.InvalidGitRepositoryError:
            raise GitError(
                f"{self.root} is not a git repository (run git init there, or point the "
                "runner at the repository's top folder)"
            ) from None
        try:
            yield repo
        finally:
            repo.close()


def _run(repo: git.Repo, *args: str, env: dict[str, str] | None = None, strip: bool = True) -> str:
    """``git <args>`` through GitPython's command wrapper; ``GitError`` with the output tail."""
    try:
        return repo.git.execute(["git", *args], env=env, strip_newline_in_stdout=strip)
    except git.GitCommandError as exc:
        output = "\n".join(
            part.strip() for part in (_text(exc.stdout), _text(exc.stderr)) if part.strip()
        )
        tail = "\n".join(output.splitlines()[-_OUTPUT_TAIL_LINES:])
        raise GitError(f"git {args[0]} failed (exit {exc.status}): {tail or 'no output'}") from None


def _text(value: object) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    text = str(value or "")
    for prefix in ("stdout: ", "stderr: "):
        text = text.strip()
        if text.startswith(prefix):
            text = text[len(prefix) :].strip("'")
    return text


def _rev(repo: git.Repo, name: str) -> str | None:
    try:
        return repo.git.rev_parse("--verify", "-q", f"{name}^{{commit}}")
    except git.GitCommandError:
        return None


def _config(repo: git.Repo, key: str) -> str | None:
    try:
        return repo.git.config("--get", key) or None
    except git.GitCommandError:
        return None


def _missing_identity(repo: git.Repo) -> list[str]:
    """Which of the committer's and author's name and email git would not find."""
    missing = []
    for role in ("author", "committer"):
        for field in ("name", "email"):
            env_var = f"GIT_{role.upper()}_{field.upper()}"
            found = (
                os.environ.get(env_var)
                or _config(repo, f"{role}.{field}")
                or _config(repo, f"user.{field}")
                or (os.environ.get("EMAIL") if field == "email" else None)
            )
            if not found and f"user.{field}" not in missing:
                missing.append(f"user.{field}")
    return missing


def _check_tag_name(repo: git.Repo, tag: str) -> None:
    try:
        repo.git.check_ref_format(f"refs/tags/{tag}")
    except git.GitCommandError:
        raise GitError(f"{tag!r} is not a valid git tag name") from None


def _move_back(repo: git.Repo, branch: str, new: str, old: str | None) -> None:
    if old:
        _run(repo, "update-ref", "-m", "runner checkpoint undone", branch, old, new)
    else:
        _run(repo, "update-ref", "-d", branch, new)


def _with_newline(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"
