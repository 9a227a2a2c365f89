"""The tests that rely on a signal pass, and quickly, in a process that inherited SIGINT ignored:
what ``make test &``, ``nohup make test &`` or a wrapper script's ``step &`` give it. Python then
installs no SIGINT handler, so a test that sends itself SIGINT must install the one it needs
(``tests.runner.gate_helpers.sigint_raises``) and bound its wait."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

SIGNAL_TESTS = [
    "test_preflight_writes.py::test_a_signal_during_start_up_exits_130_without_a_traceback",
    "test_procgroup_signals.py::test_second_interrupt_during_the_grace_period_kills_the_group",
    "test_reliability_interrupts.py::test_interrupt_writes_a_report_marked_interrupted",
    "test_reliability_interrupts.py::test_interrupted_evidence_keeps_its_report_marked_evidence",
    "test_checkpoint.py::test_interrupt_inside_the_checkpoint_takes_effect_after_it",
    "test_advance.py::test_sigterm_during_gates_leaves_the_plan_and_releases_the_lock",
    "test_advance_checkpoint.py::test_sigterm_inside_the_checkpoint_completes_it",
    "test_gate_jobs.py::test_sigterm_keeps_the_finished_gates_and_says_how_to_run_the_rest",
]
LIMIT_S = 240  # the fixed tests take seconds; the old ones waited out 600 s sleeps and grace periods


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_every_test_that_signals_itself_is_listed():
    """A test file that sends its own process a signal it can handle is one of ``SIGNAL_TESTS``'
    files (a gate's command that SIGKILLs its own process is no such test)."""
    listed = {name.split("::")[0] for name in SIGNAL_TESTS}
    sending = re.compile(r"os\.kill\(os\.getpid\(\), (?!signal\.SIGKILL)|signal\.raise_signal\(")
    for path in sorted(HERE.glob("test_*.py")):
        if path.name != Path(__file__).name and sending.search(path.read_text(encoding="utf-8")):
            assert path.name in listed, f"{path.name} signals its own process: add its tests to SIGNAL_TESTS"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process semantics")
def test_signal_tests_pass_with_sigint_ignored_as_in_a_background_job():
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
            *(f"tests/runner/{name}" for name in SIGNAL_TESTS)]
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=_ignore_sigint,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"the signal tests hung past {LIMIT_S} s with SIGINT ignored:\n{output[-3000:]}")
    assert proc.returncode == 0, output[-3000:]
    assert time.monotonic() - started < LIMIT_S
