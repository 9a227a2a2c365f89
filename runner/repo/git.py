"""The runner's one way to use git: the real ``git`` binary as a subprocess, and the queries and
refusals built on it. ``runner.repo.checkpoint`` makes the checkpoint with these; every other
module asks git only through here.

Decisions:

- Plain subprocesses, no Python git library: the checkpoint is made by the real git binary (its
  object format, its config), and a GPU host that only runs ``runner gate`` needs no git package.
- Every call runs with literal pathspecs (``kernel/*.py`` names one file), the C locale (the
  messages the runner quotes read the same everywhere), no terminal prompt, stdin from
  ``/dev/null`` and ``core.hooksPath=/dev/null``: no hook runs for the runner's own git calls. A
  hook (``post-index-change``, ``reference-transaction``) could otherwise edit a tracked file
  between the gates and the commit.
- A failing call raises ``GitError`` with the last lines of git's output; the queries that may
  legitimately find nothing (``rev``, ``current_branch``, ``blob``) return ``None`` instead.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from runner.errors import GitError
from runner.formatting import CONTROL_CHARS

OUTPUT_TAIL_LINES = 20
NO_HOOKS = ("-c", "core.hooksPath=/dev/null")

_IN_PROGRESS = {
    "MERGE_HEAD": "a merge",
    "CHERRY_PICK_HEAD": "a cherry-pick",
    "REVERT_HEAD": "a revert",
    "rebase-merge": "a rebase",
    "rebase-apply": "a rebase or git am",
}


def run_git(
    root: Path, *args: str, env: Mapping[str, str] | None = None, input: bytes | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    """``git <args>`` in ``root`` (see the module's decisions); ``GitError`` on failure with ``check``."""
    full_env = dict(os.environ)
    full_env.update({"GIT_LITERAL_PATHSPECS": "1", "LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0"})
    full_env.update(env or {})
    try:
        proc = subprocess.run(
            ["git", *NO_HOOKS, *args], cwd=root, env=full_env, input=input, capture_output=True,
            check=False, stdin=None if input is not None else subprocess.DEVNULL,
        )
    except OSError as exc:  # no git binary, or root is not a folder
        raise GitError(f"cannot run git in {root}: {exc.strerror or exc}") from None
    if check and proc.returncode != 0:
        output = (proc.stdout + b"\n" + proc.stderr).decode("utf-8", "replace").strip()
        tail = "\n".join(output.splitlines()[-OUTPUT_TAIL_LINES:])
        raise GitError(f"git {args[0]} failed (exit {proc.returncode}): {tail or 'no output'}")
    return proc


def git_output(root: Path, *args: str, **kwargs) -> str:
    """The stripped text ``git <args>`` prints (``run_git``)."""
    return run_git(root, *args, **kwargs).stdout.decode("utf-8", "replace").strip()


# --- queries ----------------------------------------------------------------------------------


def rev(root: Path, name: str) -> str | None:
    """The object ``name`` names (``HEAD^{commit}``, ``refs/tags/x``), or ``None``."""
    proc = run_git(root, "rev-parse", "--verify", "-q", name, check=False)
    return (proc.stdout.decode().strip() or None) if proc.returncode == 0 else None


def head(root: Path) -> str | None:
    """The commit ``HEAD`` names, or ``None`` before the first commit."""
    return rev(root, "HEAD^{commit}")


def tag_commit(root: Path, tag: str) -> str | None:
    """The commit the tag ``tag`` names, or ``None`` when there is no such tag."""
    return rev(root, f"refs/tags/{tag}^{{commit}}")


def changed_since(root: Path, commit: str, paths: list[str]) -> list[str]:
    """The files under ``paths`` (literal, relative to ``root``) whose work-tree content differs
    from ``commit``'s: modified, added or deleted since, committed or not, and untracked files
    git does not ignore. Sorted POSIX paths; none for no paths."""
    if not paths:
        return []
    spec = ["--", *paths]
    diff = run_git(root, "diff", "--name-only", "-z", "--no-renames", commit, *spec).stdout
    untracked = run_git(root, "ls-files", "-z", "--others", "--exclude-standard", *spec).stdout
    names = (diff + untracked).decode("utf-8", "surrogateescape").split("\0")
    return sorted({name for name in names if name})


def current_branch(root: Path) -> str | None:
    """The full ref ``HEAD`` points to (``refs/heads/main``), ``None`` when detached."""
    proc = run_git(root, "symbolic-ref", "-q", "HEAD", check=False)
    return (proc.stdout.decode().strip() or None) if proc.returncode == 0 else None


def git_dir(root: Path) -> Path:
    """The repository's git dir (the worktree's own one in a linked worktree)."""
    return Path(root, git_output(root, "rev-parse", "--git-dir")).resolve()


def blob(root: Path, revision: str, rel: str) -> bytes | None:
    """The bytes of ``rel`` in ``revision``, or ``None`` when it has no such file."""
    proc = run_git(root, "cat-file", "blob", f"{revision}:{rel}", check=False)
    return proc.stdout if proc.returncode == 0 else None


def config_value(root: Path, key: str) -> str | None:
    """``git config --get key``, or ``None`` when unset."""
    proc = run_git(root, "config", "--get", key, check=False)
    return (proc.stdout.decode("utf-8", "replace").strip() or None) if proc.returncode == 0 else None


def is_ignored(root: Path, path: str) -> bool:
    """Whether ``.gitignore`` (or the repository's excludes) ignore ``path``, tracked or not."""
    # check-ignore takes path names, not pathspecs, and refuses the literal-pathspec setting
    proc = run_git(root, "check-ignore", "-q", "--no-index", "--", path, env={"GIT_LITERAL_PATHSPECS": "0"},
                   check=False)
    return proc.returncode == 0


def ignore_rule(root: Path, path: str) -> str | None:
    """The rule that ignores ``path``, tracked or not, as ``git check-ignore -v`` names it
    (``.gitignore:3:build/``), or ``None`` when nothing ignores it."""
    proc = run_git(root, "check-ignore", "-v", "--no-index", "--", path, env={"GIT_LITERAL_PATHSPECS": "0"},
                   check=False)
    if proc.returncode != 0:
        return None
    line = proc.stdout.decode("utf-8", "replace").strip().splitlines()
    return line[0].split("\t", 1)[0] if line else "a .gitignore rule"


def adding_commit(root: Path, path: str) -> str | None:
    """The newest commit of ``HEAD``'s history that added ``path`` (a checkpoint that committed
    a run's report, or a commit of a failed run's report), or ``None``: never committed, or no
    repository here."""
    if not (Path(root) / ".git").exists():
        return None
    proc = run_git(root, "log", "-1", "--diff-filter=A", "--format=%H", "--", path, check=False)
    return (proc.stdout.decode().strip() or None) if proc.returncode == 0 else None


def is_tracked(root: Path, path: str) -> bool:
    """Whether the index tracks ``path`` (a file, or a folder with tracked files); literal."""
    return bool(git_output(root, "ls-files", "--", path))


# --- refusals ---------------------------------------------------------------------------------


def check_work_tree(root: Path) -> None:
    """``GitError`` unless ``root`` is the top folder of a git work tree."""
    root = Path(root)
    if not root.is_dir():
        raise GitError(f"{root} does not exist")
    proc = run_git(root, "rev-parse", "--show-toplevel", check=False)
    if proc.returncode != 0:
        bare = run_git(root, "rev-parse", "--is-bare-repository", check=False)
        if bare.stdout.decode().strip() == "true":
            raise GitError(f"{root} is a bare repository; the runner needs a work tree")
        raise GitError(
            f"{root} is not a git repository (run git init there, or point the runner at the "
            "repository's top folder)"
        )
    top = Path(proc.stdout.decode("utf-8", "replace").strip()).resolve()
    if top != root.resolve():
        raise GitError(f"{root} is not the top folder of its repository ({top})")


def check_ready(root: Path) -> None:
    """``GitError`` unless a checkpoint can be made in ``root`` now: no merge, rebase,
    cherry-pick, revert or ``git am`` in progress, ``HEAD`` on a branch, and a committer
    identity (``user.name`` / ``user.email`` or the ``GIT_*`` environment variables)."""
    check_work_tree(root)
    folder = git_dir(root)
    for name, what in _IN_PROGRESS.items():
        if (folder / name).exists():
            raise GitError(
                f"{what} is in progress in {root}; finish or abort it before the runner checkpoints"
            )
    if current_branch(root) is None:
        at = head(root)
        raise GitError(
            f"HEAD is detached (at {at[:12] if at else '?'}); check out a branch "
            "(git switch <branch>) so the checkpoint commit lands on it"
        )
    missing = _missing_identity(root)
    if missing:
        raise GitError(
            f"no git identity configured ({' and '.join(missing)} missing); set it with "
            "git config user.name 'Your Name' and git config user.email you@example.com"
        )


def check_tag_name(root: Path, tag: str) -> None:
    """``GitError`` unless ``refs/tags/<tag>`` is a valid ref name (``a..b``, ``alpha.``,
    ``x.lock``, spaces, control characters, ``~^:?*[\\`` are not)."""
    proc = run_git(root, "check-ref-format", f"refs/tags/{tag}", check=False)
    if proc.returncode != 0 or CONTROL_CHARS.search(tag):
        raise GitError(
            f"{tag!r} is not a valid git tag name (git check-ref-format refuses it); rename the "
            "plan or phase id (no '..', no trailing '.' or '.lock', no spaces or ~^:?*[\\)"
        )


def _missing_identity(root: Path) -> list[str]:
    """Which of ``user.name`` and ``user.email`` git would not find for author or committer."""
    missing = []
    for role in ("author", "committer"):
        for field in ("name", "email"):
            found = (
                os.environ.get(f"GIT_{role.upper()}_{field.upper()}")
                or config_value(root, f"{role}.{field}")
                or config_value(root, f"user.{field}")
                or (os.environ.get("EMAIL") if field == "email" else None)
            )
            if not found and f"user.{field}" not in missing:
                missing.append(f"user.{field}")
    return missing
