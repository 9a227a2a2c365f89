"""Gates that misbehave: killed like an out-of-memory kill, floods of output, escaped children."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from runner.gates.execute import run_gate
from runner.gates.log import HEAD_BYTES, TAIL_BYTES, CappedLog
from tests.runner.gate_helpers import group_alive, make_gate, pid_alive, python_cmd


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    return root


def go(gate, repo: Path):
    return run_gate(gate, repo_root=repo, log_path=repo.parent / "logs" / f"{gate.name}.log", grace_s=0.5)


def test_sigkill_the_runner_did_not_send_suggests_out_of_memory(repo):
    res = go(make_gate(run=python_cmd("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")), repo)
    assert res.outcome == "FAIL" and res.signal == "SIGKILL"
    assert res.reason == "killed by SIGKILL (out of memory?)"


def test_shell_reporting_a_sigkilled_command_suggests_out_of_memory(repo):
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    res = go(make_gate(run=python_cmd(code).removeprefix("exec ") + "; exit $?"), repo)
    assert res.outcome == "FAIL" and res.exit_code == 137
    assert "killed by SIGKILL (out of memory?)" in res.reason


def test_memory_limit_hit_is_a_failure_not_a_dead_runner(repo):
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
        "x = bytearray(2 << 30)"
    )
    res = go(make_gate(run=python_cmd(code)), repo)
    assert res.outcome == "FAIL" and res.exit_code == 1
    assert "MemoryError" in res.log_tail


def test_megabytes_of_output_keep_head_and_tail_with_a_marker(repo):
    # 6 MiB of numbered lines, then a last line the report must show
    code = (
        "import sys\n"
        "w = sys.stdout.write\n"
        "for i in range(120000): w(f'line {i:08d} ' + 'x' * 37 + '\\n')\n"
        "w('THE END\\n')\n"
    )
    res = go(make_gate(run=python_cmd(code)), repo)
    assert res.outcome == "PASS", res.reason
    log = (repo.parent / "logs" / "g.log").read_bytes()
    total = 120000 * len("line 00000000 " + "x" * 37 + "\n") + len("THE END\n")
    assert HEAD_BYTES + TAIL_BYTES < len(log) < HEAD_BYTES + TAIL_BYTES + 400
    assert log.startswith(b"line 00000000 ")
    [elided] = re.findall(rb"\n\[\.\.\. (\d+) bytes elided \.\.\.\]\n", log)
    runner_note = log[log.index(b"THE END\n") + len(b"THE END\n") :]
    assert int(elided) + HEAD_BYTES + TAIL_BYTES == total + len(runner_note)
    assert b"THE END\n" in log[-TAIL_BYTES - 200 :]
    assert "THE END" in res.log_tail and "first and last 1 MiB" in res.log_tail


def test_capped_log_below_the_cap_is_verbatim(tmp_path):
    log = CappedLog(tmp_path / "log", head_bytes=10, tail_bytes=5)
    for piece in (b"0123", b"4567", b"89"):
        log.write(piece)
    log.close()
    assert (tmp_path / "log").read_bytes() == b"0123456789"


def test_capped_log_elides_the_middle(tmp_path):
    log = CappedLog(tmp_path / "log", head_bytes=4, tail_bytes=3)
    for i in range(100):
        log.write(bytes([65 + i % 26]))
    log.close()
    data = (tmp_path / "log").read_bytes()
    assert data.startswith(b"ABCD\n[... 93 bytes elided ...]\n")
    assert data.endswith(bytes([65 + i % 26 for i in range(97, 100)]))


def test_escaped_grandchild_holding_the_output_does_not_hang_the_runner(repo, tmp_path):
    pid_file = tmp_path / "escaped.pid"
    # double fork + setsid: out of the gate's group, and it keeps stdout open
    code = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "        print('escaped', flush=True)\n"
        "        time.sleep(30)\n"
        "    os._exit(0)\n"
        "os.wait()\n"
    )
    started = time.monotonic()
    res = go(make_gate(run=python_cmd(code)), repo)
    try:
        assert time.monotonic() - started < 10
        assert res.outcome == "PASS", res.reason
        assert "escaped" in res.log_tail
        assert not pid_alive(int(pid_file.read_text()))  # adopted by the runner, then ended
        assert "left 1 process(es) running outside its process group" in res.reason
    finally:
        if pid_file.exists() and pid_alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_daemon_in_a_new_session_is_ended_and_reported(repo, tmp_path):
    """``setsid sleep 600 &`` leaves the gate's process group; the runner, a child subreaper,
    gets it back when the gate's shell exits, ends it and says so."""
    pid_file = tmp_path / "daemon.pid"
    # The gate exits only once the daemon is sleep in its own session: had the shell exited
    # first, the daemon would still be in the gate's group and be ended with it, unreported.
    wait = ("for i in $(seq 1000); do read -r _ c _ _ _ s _ < /proc/$p/stat; "
            "[ \"$c $s\" = \"(sleep) $p\" ] && break; sleep 0.01; done")
    res = go(make_gate(run=f"setsid sleep 600 & p=$!; echo $p > {pid_file}; {wait}; echo started"), repo)
    try:
        assert res.outcome == "PASS", res.reason
        assert "(sleep)" in res.reason and "outside its process group" in res.reason
        assert "left the gate's process group" in (repo.parent / "logs" / "g.log").read_text()
        deadline = time.monotonic() + 3
        while pid_alive(int(pid_file.read_text())) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not pid_alive(int(pid_file.read_text()))
    finally:
        if pid_alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_children_the_runner_had_before_the_gate_are_left_alone(repo, tmp_path):
    own = subprocess.Popen(["sleep", "30"])
    # The gate exits only once its child is in a new session (it writes its pid after setsid), so
    # the runner always finds it outside the group, however loaded the machine.
    pid_file = tmp_path / "escaped.pid"
    run = f"setsid sh -c 'echo $$ > {pid_file}; exec sleep 600' & while [ ! -s {pid_file} ]; do sleep 0.01; done"
    try:
        res = go(make_gate(run=run), repo)
        assert "outside its process group" in res.reason
        assert own.poll() is None  # still running
    finally:
        own.kill()
        own.wait()
        if pid_file.exists() and pid_alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_plain_background_child_is_ended_with_the_gate(repo, tmp_path):
    pid_file = tmp_path / "bg.pid"
    res = go(make_gate(run=f"sleep 60 & echo $! > {pid_file}; echo started"), repo)
    assert res.outcome == "PASS", res.reason
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 3
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not pid_alive(pid)
    assert group_alive(pid) == []
