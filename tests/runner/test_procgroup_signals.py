"""Ending a gate when the runner is hurried or killed: a second interrupt during the grace
period, and a runner killed with SIGKILL while its gate runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.gates import procgroup
from tests.runner.gate_helpers import pid_alive, sigint_raises

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux process semantics")


def _wait_until(predicate, seconds: float = 300.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_second_interrupt_during_the_grace_period_kills_the_group(monkeypatch):
    # a group whose members ignore SIGTERM, so only SIGKILL ends them
    proc = subprocess.Popen(["bash", "-c", "trap '' TERM; sleep 600 & wait"], start_new_session=True)
    assert _wait_until(lambda: len(procgroup.group_members(proc.pid)) == 2)
    real_wait = procgroup.wait_group_gone
    calls = []

    def impatient(pgid, p, seconds):
        calls.append(seconds)
        if len(calls) == 1:  # the grace period: the user presses Ctrl-C again
            os.kill(os.getpid(), signal.SIGINT)
        return real_wait(pgid, p, seconds)

    monkeypatch.setattr(procgroup, "wait_group_gone", impatient)
    try:
        with sigint_raises(), pytest.raises(KeyboardInterrupt):
            procgroup.end_group(proc, grace_s=60)  # bounded: a dropped SIGINT fails after the grace
        assert _wait_until(lambda: not procgroup.group_members(proc.pid))
    finally:
        procgroup.signal_group(proc.pid, signal.SIGKILL)
        proc.wait()


RUNNER = """
import sys
from pathlib import Path
from runner.gates.execute import run_gate
from tests.runner.gate_helpers import make_gate
root = Path(sys.argv[1])
gate = make_gate("sleeper", "verify", run='echo $$ > "%s.tmp" && mv "%s.tmp" "%s" && exec sleep 600' % ((sys.argv[2],) * 3), timeout=600)
run_gate(gate, repo_root=root, log_path=root / "g.log")
"""


def test_sigkilled_runner_takes_its_gate_with_it(tmp_path):
    pid_file = tmp_path / "gate.pid"
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, str(tmp_path), str(pid_file)],
                              cwd=Path(__file__).resolve().parents[2])
    gate_pid = None
    try:
        assert _wait_until(pid_file.exists, 60), "the gate never started"
        gate_pid = int(pid_file.read_text())
        assert pid_alive(gate_pid)
        runner.send_signal(signal.SIGKILL)
        runner.wait()
        assert _wait_until(lambda: not pid_alive(gate_pid)), "the gate outlived its SIGKILLed runner"
    finally:
        runner.kill()
        runner.wait()
        if gate_pid is not None and pid_alive(gate_pid):
            os.kill(gate_pid, signal.SIGKILL)


def test_wrapper_keeps_pid_exit_status_and_signals(tmp_path):
    argv = procgroup.with_parent_death_signal(["bash", "-c", "echo $$; exit 7"])
    proc = subprocess.run(argv, capture_output=True, text=True)
    assert proc.returncode == 7
    argv = procgroup.with_parent_death_signal(["bash", "-c", "kill -SEGV $$"])
    assert subprocess.run(argv).returncode == -signal.SIGSEGV
    argv = procgroup.with_parent_death_signal(["/nonexistent/cmd"])
    proc = subprocess.run(argv, capture_output=True, text=True)
    assert proc.returncode == 127 and "cannot run" in proc.stderr
