"""End a gate's whole process group, and see which of its processes are still alive.

A gate runs as the leader of its own session and process group (``start_new_session``), so
the group id is the leader's pid. Liveness is read from ``/proc`` where it exists, because
orphaned zombies are not always reaped in containers and ``killpg(pgid, 0)`` counts them.

What ends a gate, and what cannot be prevented:

* A second Ctrl-C or SIGTERM while ``end_group`` waits out the grace period sends SIGKILL to
  the group at once (then the interrupt goes on): an impatient user never leaves it running.
* On Linux the gate's main process is started through ``with_parent_death_signal``: a tiny
  exec wrapper sets ``PR_SET_PDEATHSIG`` to SIGKILL, so a runner killed with SIGKILL (which
  runs no cleanup) takes the gate's main process with it. The kernel sends that signal when
  the *thread* that started the gate ends, so gates must be started from a thread that lives
  as long as they do (the runner starts them from the main thread).
* A process that leaves the group (``setsid sleep 600 &``, a double fork) is out of reach of
  ``killpg``. On Linux the runner makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``,
  ``adopt_orphans``): such a process, orphaned when its parent exits, becomes the runner's child
  instead of init's, so after the gate the runner finds it among its own children
  (``end_escaped``), ends its group and reports it. Children the runner had before the gate
  started are never touched.
* Not preventable: while the runner lives, an escaped process whose parent is still alive
  is not reparented yet; after a SIGKILL of the runner, the gate's other processes do not get
  the parent-death signal (only the main one), nor does an escaped one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
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
    try:
        gone = wait_group_gone(pgid, proc, grace_s)
    except BaseException:  # a second interrupt during the grace period: no more grace
        signal_group(pgid, signal.SIGKILL)
        raise
    if not gone:
        signal_group(pgid, signal.SIGKILL)
        wait_group_gone(pgid, proc, _KILL_WAIT_S)
    proc.poll()
    return len(members)


# Run with ``python -I -S -c``: set PR_SET_PDEATHSIG, make sure the parent did not die before
# that (then it would never come), then exec the gate's command in this same process.
_DEATHSIG_WRAPPER = """
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:
    sys.stderr.write("runner: PR_SET_PDEATHSIG failed; the gate runs without it\\n")
if os.getppid() != int(sys.argv[1]):
    os._exit(137)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    sys.stderr.write(f"runner: cannot run {sys.argv[2]!r}: {exc}\\n")
    os._exit(127)
"""


def with_parent_death_signal(argv: list[str]) -> list[str]:
    """``argv`` run through a wrapper that sets ``PR_SET_PDEATHSIG`` (SIGKILL) for the process
    and then execs ``argv`` in it (same pid, so the same process group and exit status). On
    systems other than Linux ``argv`` is returned as it is."""
    if not sys.platform.startswith("linux") or not argv:
        return list(argv)
    return [sys.executable, "-I", "-S", "-c", _DEATHSIG_WRAPPER, str(os.getpid()), *argv]


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
    return [pid for pid, parent, group in _live_processes() if group == pgid]


def _live_processes():
    """``(pid, parent pid, process group)`` of every live (non-zombie) process, from ``/proc``."""
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # state, ppid, pgrp, ... (the name may hold spaces)
        if len(fields) > 2 and fields[0] not in (b"Z", b"X"):
            yield int(entry.name), int(fields[1]), int(fields[2])


_PR_SET_CHILD_SUBREAPER = 36


def adopt_orphans() -> bool:
    """Make this process the child subreaper of its descendants (Linux); whether it is one.

    Orphans of the gate (a daemon in a new session) are then reparented here, not to init.
    Idempotent; ``False`` where ``prctl`` is not there or refuses.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def own_children() -> set[int]:
    """The live processes whose parent is this process (from ``/proc``; empty without it)."""
    me = os.getpid()
    return {pid for pid, parent, _ in _live_processes() if parent == me}


def end_escaped(before: set[int], grace_s: float) -> list[str]:
    """End the processes adopted since ``before`` was taken (``own_children``): escaped from a
    gate's group and orphaned, they are this process's children now. Each one's own group gets
    SIGTERM, then SIGKILL after ``grace_s``; the ended processes are reaped. Returns ``"pid
    (name)"`` of each one found."""
    escaped = sorted(own_children() - before)
    if not escaped:
        return []
    names = [f"{pid} ({_name(pid)})" for pid in escaped]
    own_group = os.getpgrp()
    groups = {pid: _group_of(pid) for pid in escaped}
    for pid, group in groups.items():
        if group not in (None, own_group):
            signal_group(group, signal.SIGTERM)
        else:
            _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_reap(pid) for pid in escaped):
        time.sleep(_POLL_S)
    for pid, group in groups.items():
        if _reap(pid):
            if group not in (None, own_group):
                signal_group(group, signal.SIGKILL)
            _kill(pid, signal.SIGKILL)
    kill_deadline = time.monotonic() + _KILL_WAIT_S
    while time.monotonic() < kill_deadline and any(_reap(pid) for pid in escaped):
        time.sleep(_POLL_S)
    return names


def _reap(pid: int) -> bool:
    """Reap ``pid`` if it ended; whether it is still running."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == 0


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _kill(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text(errors="replace").strip() or "?"
    except OSError:
        return "?"
