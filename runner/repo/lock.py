"""One runner per repository at a time: a lock file that names its holder.

The lock is ``runner.lock`` in the work tree's git dir (``.git/``, or the folder a ``.git``
file names in a linked worktree, a submodule or a separate-git-dir checkout), never part of the
tree or its fingerprint; without a git dir it is ``.runner.lock`` at the root, which the
fingerprint leaves out whatever ``.gitignore`` says. It is
created with ``O_CREAT | O_EXCL`` and holds JSON ``{pid, host, command, started, token}``.

A lock left behind by a process that is gone (same host, pid not running), or one that is
empty or unreadable and older than ``STALE_UNREADABLE_S``, is taken over: under a short-lived
``.takeover`` guard file the lock is re-read (it must be unchanged), the new content is written
to a temporary file and renamed over it, and it is read back to confirm it is ours. A lock
naming another host is never taken over (its pid cannot be checked from here).

With ``wait_s`` a runner that finds the lock held polls every ``POLL_S`` until it gets the lock
or the time is up (``math.inf``: no limit; an interrupt still ends the wait).
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from runner.errors import LockHeldError
from runner.timeutil import iso_time, utc_now

STALE_UNREADABLE_S = 5.0
POLL_S = 0.2


FALLBACK_NAME = ".runner.lock"  # at the root when there is no git dir; never fingerprinted


def lock_path(root: Path) -> Path:
    """Where the lock of the repository at ``root`` lives: ``runner.lock`` in its git dir, found
    without running git. ``.git`` is that folder in a plain clone; in a linked worktree, a
    submodule or a ``--separate-git-dir`` checkout ``.git`` is a file whose ``gitdir:`` line
    names it (each linked worktree has its own, so runners in two worktrees do not block each
    other). Without either, ``.runner.lock`` at the root."""
    root = Path(root)
    git_dir = git_dir_of(root)
    return git_dir / "runner.lock" if git_dir is not None else root / FALLBACK_NAME


def git_dir_of(root: Path) -> Path | None:
    """The git dir of the work tree at ``root`` (see ``lock_path``), or ``None``."""
    dot_git = Path(root) / ".git"
    if dot_git.is_dir():
        return dot_git
    if not dot_git.is_file():
        return None
    try:
        first = dot_git.read_text(encoding="utf-8", errors="replace")[:4096].splitlines()[0]
    except (OSError, IndexError):
        return None
    key, sep, value = first.partition(":")
    if not sep or key.strip() != "gitdir" or not value.strip():
        return None
    target = Path(value.strip())
    if not target.is_absolute():
        target = Path(root) / target
    return target if target.is_dir() else None


@contextmanager
def repo_lock(root: Path, command: str, *, wait_s: float | None = None) -> Iterator[Path]:
    """Hold the repository lock for the duration of the block; yield the lock's path.

    Raises ``LockHeldError`` naming the holder when another live runner holds it, at once
    or, with ``wait_s`` seconds (``math.inf``: no limit), when it is still held after that
    long. The lock is released on exit, also on exceptions, and only if it is still ours.
    """
    path = lock_path(root)
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": command,
        "started": _now_iso(),
        "token": uuid.uuid4().hex,
    }
    _acquire_waiting(path, record, wait_s)
    try:
        yield path
    finally:
        _release(path, record["token"])


def _acquire_waiting(path: Path, record: dict, wait_s: float | None) -> None:
    started = time.monotonic()
    deadline = None if wait_s is None else started + max(0.0, wait_s)
    while True:
        record["started"] = _now_iso()
        try:
            _acquire(path, record)
            return
        except LockHeldError as error:
            if deadline is None:
                raise
            now = time.monotonic()
            if now >= deadline:
                raise LockHeldError(f"{error} (gave up after waiting {now - started:.1f} s)") from None
            time.sleep(min(POLL_S, deadline - now) if math.isfinite(deadline) else POLL_S)


def _acquire(path: Path, record: dict) -> None:
    payload = json.dumps(record, indent=2) + "\n"
    for _ in range(5):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(payload)
            return
        raw = _read_raw(path)
        if raw is None:
            continue  # released in the meantime: try to create it again
        _refuse_unless_stale(path, raw)
        if _replace_if_unchanged(path, raw, payload, record["token"]):
            now_there = _parse(_read_raw(path))
            if now_there is None or now_there.get("token") != record["token"]:
                raise LockHeldError(
                    _held_message(path, now_there) if now_there
                    else f"{path} was taken by another runner; try again in a moment"
                )
            return
    raise LockHeldError(f"{path} keeps changing: other runners are starting; try again")


def _refuse_unless_stale(path: Path, raw: str) -> None:
    """Raise ``LockHeldError`` unless the lock holding ``raw`` may be taken over."""
    holder = _parse(raw)
    if holder is None:
        age = _age_s(path)
        if age is not None and age < STALE_UNREADABLE_S:
            raise LockHeldError(
                f"{path} is being written by another runner (changed {age:.1f} s ago); "
                "try again in a moment, or delete the file if no runner is running"
            )
    elif not _holder_gone(holder):
        raise LockHeldError(_held_message(path, holder))


def _replace_if_unchanged(path: Path, raw: str, payload: str, token: str) -> bool:
    """Replace the stale lock by ours unless it changed since it was read as ``raw``.

    Take-overs are serialised by a ``.takeover`` guard file, so two runners that both found
    the same stale lock cannot both install theirs. Returns whether ours was installed.
    """
    guard = path.with_name(path.name + ".takeover")
    try:
        os.close(os.open(guard, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        age = _age_s(guard)
        if age is not None and age >= STALE_UNREADABLE_S:
            guard.unlink(missing_ok=True)  # left by a runner that died mid-take-over
            return False
        raise LockHeldError(
            f"another runner is taking over the stale lock {path}; try again in a moment"
        ) from None
    tmp = path.with_name(f"{path.name}.{token}.tmp")
    try:
        if _read_raw(path) != raw:
            return False
        tmp.write_text(payload, encoding="utf-8")
        os.replace(tmp, path)
        return True
    finally:
        tmp.unlink(missing_ok=True)
        guard.unlink(missing_ok=True)


def _now_iso() -> str:
    return iso_time(utc_now())


def _release(path: Path, token: str) -> None:
    holder = _parse(_read_raw(path))
    if holder is not None and holder.get("token") == token:
        path.unlink(missing_ok=True)


def _read_raw(path: Path) -> str | None:
    """The lock file's text, or ``None`` when there is no lock file."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    except OSError:
        return ""


def _parse(raw: str | None) -> dict | None:
    """The holder record in ``raw``, or ``None`` when it is missing, empty or not valid."""
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
        return None
    return data


def _holder_gone(holder: dict) -> bool:
    if holder.get("host") != socket.gethostname():
        return False  # another machine's process: cannot tell, so assume it is alive
    return not pid_alive(holder["pid"])


def _age_s(path: Path) -> float | None:
    try:
        return max(0.0, time.time() - path.stat().st_mtime)
    except OSError:
        return None


def _held_message(path: Path, holder: dict) -> str:
    host = holder.get("host")
    where = "" if host == socket.gethostname() else f" on host {host}"
    return (
        f"another runner (pid {holder.get('pid')}{where}, {holder.get('command', '?')!r}, "
        f"since {holder.get('started', '?')}) holds {path}; wait for it or, if that process "
        "is gone, delete the file"
    )


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this machine (one of another user counts; a
    zombie too). ``False`` for 0 and negative numbers, which name groups, not processes."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
