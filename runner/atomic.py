"""Write a file so that readers see the old or the new content, never a mix.

Decisions:

- The text goes to a temp file in the target's folder, which is fsynced, then renamed over the
  target; the folder is fsynced too, so the rename survives a crash.
- An existing file keeps its mode; a new one gets ``0o666`` less the umask. A symlink is
  followed: its target is replaced, the link stays.
- The temp file is named ``.<name>.runner-<pid>-<random>.tmp``: a writer killed before the
  rename leaves it behind, and ``leftover_temps`` finds it with the pid of its writer, so a
  later run can remove those of dead processes (the checkpoint's ``recover`` does for the plan).
- Errors are ``OSError``; callers turn them into their own ``RunnerError`` (the plan writer
  into ``PlanError``).
"""

from __future__ import annotations

import glob
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

_TEMP_TAG = ".runner-"


def write_atomic(path: Path | str, text: str, *, make_parents: bool = False) -> None:
    """Write ``text`` (UTF-8, line endings as given) to ``path`` atomically.

    ``make_parents`` creates missing folders first; without it a missing folder is an error.
    """
    write_atomic_bytes(path, text.encode("utf-8"), make_parents=make_parents)


def write_atomic_bytes(path: Path | str, data: bytes, *, make_parents: bool = False) -> None:
    """Write ``data`` to ``path`` atomically, byte for byte (``write_atomic``)."""
    target = Path(os.path.realpath(path))
    if make_parents:
        target.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_current_umask()
    handle, temp_name = tempfile.mkstemp(
        prefix=f".{target.name}{_TEMP_TAG}{os.getpid()}-", suffix=".tmp", dir=target.parent
    )
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temp_name, mode)
        os.replace(temp_name, target)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    _fsync_directory(target.parent)


def leftover_temps(path: Path | str) -> Iterator[tuple[Path, int]]:
    """The temp files that writes to ``path`` left in its folder, each with the pid of the
    process that made it (alive or not: the caller decides)."""
    target = Path(os.path.realpath(path))
    prefix = f".{target.name}{_TEMP_TAG}"
    for temp in target.parent.glob(f"{glob.escape(prefix)}*.tmp"):
        pid = temp.name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit():
            yield temp, int(pid)


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_directory(directory: Path) -> None:
    try:
        handle = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # some platforms cannot open a directory; the rename is still atomic
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)
