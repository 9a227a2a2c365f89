"""What a person reads: events as they happen in a CI log, a failing gate's tail and log path,
where the logs of ``runner gate`` are, and hints that name commands that work as typed."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from runner.cli import invoked_as
from runner.cli._common import GateOutput
from runner.errors import ExitCode
from tests.runner.repo_fixtures import cli, default_phases, gate, make_repo

ROOT = Path(__file__).resolve().parents[2]


def _plain_output() -> tuple[GateOutput, io.StringIO]:
    buffer = io.StringIO()
    return GateOutput(Console(file=buffer, force_terminal=False, width=200)), buffer


def test_progress_is_one_line_at_a_time_without_a_terminal():
    output, buffer = _plain_output()
    output.PROGRESS_EVERY_S = 10
    output.on_start("alpha", "bench", Path("/tmp/x/bench.log"))
    for second in range(0, 35):
        output.on_progress("bench", float(second), second, 100)
    lines = buffer.getvalue().splitlines()
    assert lines[0].startswith("alpha / bench: started (log ")
    assert [line.strip() for line in lines[1:]] == [
        "bench: running 10 s  10/100", "bench: running 20 s  20/100", "bench: running 30 s  30/100"]


def test_failing_gate_shows_its_tail_and_log(tmp_path, runner_env):
    phases = default_phases()
    phases[0]["gates"] = [gate("build", "build", "for i in $(seq 1 40); do echo line $i; done; exit 3")]
    repo = make_repo(tmp_path / "repo", phases)
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == ExitCode.GATE_FAILED
    err = result.stderr
    assert err.index("alpha / build: started") < err.index("FAIL")
    assert "| line 40" in err and "| line 20" not in err  # the last lines only
    [log_line] = [line for line in err.splitlines() if "full log:" in line]
    log = repo.root / log_line.split("full log:", 1)[1].strip()
    assert log.is_file() and "line 1\n" in log.read_text()


def test_gate_names_and_keeps_its_log_folder(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    result = cli(runner_env, repo.root, "gate", "alpha")
    assert result.exit_code == 0, result.text
    [line] = [line for line in result.stdout.splitlines() + result.stderr.splitlines()
              if line.startswith("gate logs in ")][:1] or [None]
    assert line is not None, result.text
    folder = Path(line.removeprefix("gate logs in ").strip())
    folder = folder if folder.is_absolute() else repo.root / folder
    assert (folder / "alpha" / "build.log").is_file()
    assert repo.porcelain() == ""
    explicit = tmp_path / "logs"
    result = cli(runner_env, repo.root, "gate", "alpha", "--logs", str(explicit))
    assert (explicit / "alpha" / "check.log").is_file()


def test_blocked_hint_names_commands_that_work(tmp_path, runner_env):
    phases = default_phases()
    phases[0]["gates"] = [gate("check", "verify", "true", requires=["cuda"])]
    repo = make_repo(tmp_path / "repo", phases)
    result = cli(runner_env, repo.root, "advance")
    assert "`python -m runner gate alpha --out results.json`" in result.stderr
    assert "`runner advance --results results.json`" in result.stderr


def test_invoked_as(tmp_path, monkeypatch):
    assert invoked_as(str(ROOT / "runner" / "__main__.py")) == "python -m runner"
    monkeypatch.chdir(tmp_path)
    script = tmp_path / ".venv" / "bin" / "runner"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert invoked_as(str(script)) == ".venv/bin/runner"
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin:/bin")
    assert invoked_as(str(script)) == "runner"


def test_events_reach_a_pipe_while_the_gate_runs(tmp_path):
    """The start line is readable before the gate ends: the gate waits for the test to see it."""
    go = tmp_path / "go"
    phases = default_phases()
    phases[0]["gates"] = [gate("build", "build", f'while [ ! -e "{go}" ]; do sleep 0.05; done', timeout=600)]
    repo = make_repo(tmp_path / "repo", phases, git_init=False)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RUNNER_DEVICES": "cpu"}
    proc = subprocess.Popen([sys.executable, "-m", "runner", "gate", "alpha"], cwd=repo.root, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        for line in proc.stderr:  # blocks until a line arrives; the gate cannot end before `go`
            seen.append(line)
            if "alpha / build: started" in line:
                break
        assert any("started" in line for line in seen), seen
        go.touch()
        rest = proc.stderr.read()
        assert proc.wait(600) == 0 or "blocked" in rest
        assert "alpha / build (build): PASS" in rest
    finally:
        go.touch()
        proc.kill()
        proc.wait()
