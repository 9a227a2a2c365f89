"""Repository lock: exclusive, names its holder, takes over stale locks, releases only its own."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from runner.errors import LockHeldError
from runner.repo.lock import STALE_UNREADABLE_S, lock_path, repo_lock

ROOT = Path(__file__).resolve().parents[2]


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def write_lock(path: Path, **fields) -> None:
    record = {"pid": os.getpid(), "host": socket.gethostname(), "command": "runner advance",
              "started": "2024-05-01T10:00:00Z", "token": "theirs"} | fields
    path.write_text(json.dumps(record))


def test_lock_path_prefers_git_dir(tmp_path):
    assert lock_path(tmp_path) == tmp_path / ".runner.lock"
    (tmp_path / ".git").write_text("gitdir: elsewhere\n")  # a worktree's .git file
    assert lock_path(tmp_path) == tmp_path / ".runner.lock"
    (tmp_path / ".git").unlink()
    (tmp_path / ".git").mkdir()
    assert lock_path(tmp_path) == tmp_path / ".git" / "runner.lock"


def test_acquire_writes_holder_and_releases(tmp_path):
    with repo_lock(tmp_path, "runner gate kernel") as path:
        record = json.loads(path.read_text())
        assert record["pid"] == os.getpid()
        assert record["host"] == socket.gethostname()
        assert record["command"] == "runner gate kernel"
        assert record["started"].endswith("Z")
    assert not path.exists()


def test_second_holder_is_refused_with_a_clear_message(tmp_path):
    with repo_lock(tmp_path, "runner advance") as path:
        with pytest.raises(LockHeldError) as info:
            with repo_lock(tmp_path, "runner status"):
                pass  # pragma: no cover
        message = str(info.value)
        assert f"pid {os.getpid()}" in message and "'runner advance'" in message
        assert str(path) in message and "delete the file" in message
        assert path.exists()  # the refused attempt left the holder's lock alone
    assert not path.exists()


def test_live_process_from_elsewhere_holds(tmp_path):
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        write_lock(tmp_path / ".runner.lock", pid=sleeper.pid)
        with pytest.raises(LockHeldError, match=f"pid {sleeper.pid}"):
            with repo_lock(tmp_path, "x"):
                pass  # pragma: no cover
    finally:
        sleeper.kill()
        sleeper.wait()


def test_dead_holder_is_taken_over(tmp_path):
    path = tmp_path / ".runner.lock"
    write_lock(path, pid=dead_pid())
    with repo_lock(tmp_path, "runner advance"):
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert not path.exists()
    assert not list(tmp_path.glob(".runner.lock.*"))  # no temp or guard files left


def test_other_host_is_never_taken_over(tmp_path):
    write_lock(tmp_path / ".runner.lock", pid=dead_pid(), host="some-other-host")
    with pytest.raises(LockHeldError, match="on host some-other-host"):
        with repo_lock(tmp_path, "x"):
            pass  # pragma: no cover


@pytest.mark.parametrize("content", ["", "{not json", '{"pid": "12"}'])
def test_unreadable_lock_taken_over_only_when_old(tmp_path, content):
    path = tmp_path / ".runner.lock"
    path.write_text(content)
    with pytest.raises(LockHeldError, match="being written"):
        with repo_lock(tmp_path, "x"):
            pass  # pragma: no cover
    old = time.time() - STALE_UNREADABLE_S - 10
    os.utime(path, (old, old))
    with repo_lock(tmp_path, "x"):
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert not path.exists()


def test_released_on_exception(tmp_path):
    with pytest.raises(RuntimeError):
        with repo_lock(tmp_path, "x") as path:
            raise RuntimeError("boom")
    assert not path.exists()


def test_lock_that_is_no_longer_ours_is_left_alone(tmp_path):
    with repo_lock(tmp_path, "x") as path:
        write_lock(path, token="someone-else")
    assert json.loads(path.read_text())["token"] == "someone-else"


def test_stale_lock_race_has_one_winner(tmp_path):
    path = tmp_path / ".runner.lock"
    write_lock(path, pid=dead_pid())
    start_at = time.time() + 0.7
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(ROOT)!r})
        from runner.errors import LockHeldError
        from runner.repo.lock import repo_lock
        time.sleep(max(0.0, {start_at!r} - time.time()))
        try:
            with repo_lock({str(tmp_path)!r}, "racer"):
                print("got", flush=True)
                time.sleep(0.8)
        except LockHeldError:
            print("held", flush=True)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
             for _ in range(6)]
    outputs = [proc.communicate(timeout=30)[0].strip() for proc in procs]
    assert sorted(outputs) == ["got"] + ["held"] * 5
    assert not path.exists()
