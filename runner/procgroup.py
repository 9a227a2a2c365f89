"""End a gate's whole process group, and see which of its processes are still alive.

A gate runs as the leader of its own session and process group (``start_new_session``), so
the group id is the leader's pid. Liveness is read from ``/proc`` where it exists, because
orphaned zombies are not always reaped in containers and ``killpg(pgid, 0)`` counts them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

_POLL_S = 0.05
_KILL_WAIT_S = 2.0  # after SIGKILL: how long to wait for the group to disappear


def end_group(proc: subprocess.Popen, grace_s: float) -> int:
    """End every process of the gate's group; return how many were still running.

    SIGTERM first, SIGKILL for what is left after ``grace_s``. The direct child is reaped
    while waiting, so its zombie does not count as a member.
    """
    pgid = proc.pid  # start_new_session: the child leads its own group
    proc.poll()
    members = group_members(pgid)
    if not members:
        return 0
    signal_group(pgid, signal.SIGTERM)
    if not wait_group_gone(pgid, proc, grace_s):
        signal_group(pgid, signal.SIGKILL)
        wait_group_gone(pgid, proc, _KILL_WAIT_S)
    proc.poll()
    return len(members)


def signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def wait_group_gone(pgid: int, proc: subprocess.Popen, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        proc.poll()
        if not group_members(pgid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of group ``pgid``.

    Reads ``/proc`` where it exists, because orphaned zombies are not always reaped in
    containers and ``killpg(pgid, 0)`` counts them; elsewhere falls back to ``killpg``.
    """
    proc_dir = Path("/proc")
    if not (proc_dir / "self" / "stat").exists():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    members = []
    for entry in os.scandir(proc_dir):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(int(entry.name))
    return members
