"""``python -m serving generate`` in a child process whose memory is capped and measured.

``RLIMIT_DATA`` caps the child's heap and anonymous mappings, so a regression that allocates
what it should have refused fails fast instead of swapping the machine; ``os.wait4`` gives the
child's own peak RSS.
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


def run_serving(*args, data_limit: int = DATA_LIMIT, timeout: float = 120) -> Run:
    """Run ``python -m serving generate *args`` under ``data_limit``; return its outcome and peak RSS."""
    return run_bounded(["-m", "serving", "generate", *map(str, args)], data_limit, timeout)


def run_python(code: str, data_limit: int = DATA_LIMIT, timeout: float = 120) -> Run:
    """Run ``python -c code`` (from the repository root) under ``data_limit``."""
    return run_bounded(["-c", code], data_limit, timeout)


def run_bounded(argv: list[str], data_limit: int, timeout: float) -> Run:
    """``python *argv`` with RLIMIT_DATA = ``data_limit``; raises TimeoutError past ``timeout`` seconds."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (data_limit, data_limit))

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, stdout=out,
                                stderr=err, text=True, preexec_fn=cap)
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
        return Run(proc.returncode, out.read(), err.read(), usage.ru_maxrss / 1024)
