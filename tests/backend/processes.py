"""``python -m serving generate`` in a child process whose memory is capped and measured.

``RLIMIT_DATA`` caps the child's heap and anonymous mappings, so a regression that allocates
what it should have refused fails fast instead of swapping the machine.

Decisions:
- The peak is the child's own: ``VmHWM`` of ``/proc/self/status``, read by the child as it exits.
  ``ru_maxrss`` from ``wait4`` is not: the child is forked (``preexec_fn`` rules out vfork), a
  fork copies the parent's resident-set counters, and exec keeps the old image's high-water mark
  in the process's ``maxrss``. So ``ru_maxrss`` is at least the test process's RSS when it forked:
  late in a full suite (a pytest process grown past the child's own peak) a one-token run and a
  30k-token run then both read as the parent, and their difference as nothing. ``VmHWM`` belongs
  to the memory the child's program mapped after exec. Where ``/proc`` is missing, ``ru_maxrss``.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA_LIMIT = 2 << 30  # bytes: well above a tiny run (about 0.3 GB), far below what a refusal guards against


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    peak_rss_mb: float


PEAK_ENV = "MLA_GATE_TEST_PEAK_FILE"
# Run as the child's program: record VmHWM (kB) in the file PEAK_ENV names when the child exits,
# then run what ``sys.argv`` holds (``-m MODULE ARGS`` or ``-c CODE``).
_MEASURED = """
import atexit, os, runpy, sys

def _record_peak():
    try:
        with open("/proc/self/status") as status:
            kb = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return
    with open(os.environ["%s"], "w") as out:
        out.write(kb)

atexit.register(_record_peak)
mode, target, *rest = sys.argv[1:]
sys.argv = [target, *rest]
if mode == "-m":
    runpy.run_module(target, run_name="__main__", alter_sys=True)
else:
    exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})
""" % PEAK_ENV


def run_serving(*args, data_limit: int = DATA_LIMIT, timeout: float = 120) -> Run:
    """Run ``python -m serving generate *args`` under ``data_limit``; return its outcome and peak RSS."""
    return run_bounded(["-m", "serving", "generate", *map(str, args)], data_limit, timeout)


def run_python(code: str, data_limit: int = DATA_LIMIT, timeout: float = 120) -> Run:
    """Run ``python -c code`` (from the repository root) under ``data_limit``."""
    return run_bounded(["-c", code], data_limit, timeout)


def run_bounded(argv: list[str], data_limit: int, timeout: float) -> Run:
    """``python *argv`` (``-m MODULE ...`` or ``-c CODE``) with RLIMIT_DATA = ``data_limit``, its own
    peak RSS measured (see the module's decisions); raises TimeoutError past ``timeout`` seconds."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (data_limit, data_limit))

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, \
            tempfile.NamedTemporaryFile("r", suffix=".peak") as peak:
        env = {**os.environ, PEAK_ENV: peak.name}
        proc = subprocess.Popen([sys.executable, "-c", _MEASURED, *argv], cwd=ROOT, stdout=out,
                                stderr=err, text=True, preexec_fn=cap, env=env)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                os.wait4(proc.pid, 0)
                raise TimeoutError(f"python {' '.join(argv)} ran past {timeout} s")
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: keep Popen from waiting again
        out.seek(0)
        err.seek(0)
        recorded = peak.read().strip()
        peak_kb = int(recorded) if recorded.isdigit() else usage.ru_maxrss
        return Run(proc.returncode, out.read(), err.read(), peak_kb / 1024)
