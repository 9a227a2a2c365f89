"""Write a file so that readers see the old or the new content, never a mix.

Decisions:

- The text goes to a temp file in the target's folder, which is fsynced, then renamed over the
  target; the folder is fsynced too, so the rename survives a crash.
- An existing file keeps its mode; a new one gets ``0o666`` less the umask. A symlink is
  followed: its target is replaced, the link stays.
- Errors are ``OSError``; callers turn them into their own ``RunnerError`` (the plan writer
  into ``PlanError``).
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path


def write_atomic(path: Path | str, text: str, *, make_parents: bool = False) -> None:
    """Write ``text`` (UTF-8, line endings as given) to ``path`` atomically.

    ``make_parents`` creates missing folders first; without it a missing folder is an error.
    """
    target = Path(os.path.realpath(path))
    if make_parents:
        target.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_current_umask()
    handle, temp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(text.encode("utf-8"))
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temp_name, mode)
        os.replace(temp_name, target)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    _fsync_directory(target.parent)


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
