"""``runner gate --out`` written after each gate: a job killed at its time limit keeps the gates it
finished (and only those), the next job runs the rest with ``--only``, and one import records the
phase. ``--only`` itself refuses what it cannot mean."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runner.plan.load import load_plan
from runner.records.results import ResultsFile
from tests.runner.gate_helpers import group_alive
from tests.runner.repo_fixtures import cli, copy_without_git, default_phases, gate, make_repo
from tests.runner.split_helpers import coverage, job, split_repo

ROOT = Path(__file__).resolve().parents[2]
SITE = """
from runner.records import machine
from tests.runner.repo_fixtures import fake_machine
machine.probe_machine = lambda *args, **kwargs: fake_machine()
"""


def _wait_for(path: Path, seconds: float = 120.0) -> bool:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def slow_repo(tmp_path: Path):
    """alpha: build, check (while ``flags/slow`` exists it says so in ``started`` and sleeps),
    bench."""
    flags = tmp_path / "flags"
    flags.mkdir()
    phases = default_phases()
    phases[0]["gates"] = [
        gate("build", "build", "echo building"),
        gate("check", "verify", f'if [ -e "{flags}/slow" ]; then touch "{tmp_path}/started"; exec sleep 600; fi',
             timeout=120),
        gate("bench", "benchmark", "true"),
    ]
    repo = make_repo(tmp_path / "repo", phases)
    return repo, copy_without_git(repo.root, tmp_path / "host"), flags


def start_job(tmp_path: Path, host: Path, out: Path) -> subprocess.Popen:
    """``python -m runner gate alpha --out OUT`` on the host as a job of its own (a session)."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)]), "RUNNER_DEVICES": "cpu"}
    return subprocess.Popen([sys.executable, "-m", "runner", "gate", "alpha", "--out", str(out)], cwd=host, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def kill_job(proc: subprocess.Popen) -> None:
    """SIGKILL, as a scheduler ends a job at its time limit, and wait for its gates to go."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 60
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_killed_job_keeps_the_gates_it_finished_and_the_next_job_runs_the_rest(tmp_path, runner_env):
    repo, host, flags = slow_repo(tmp_path)
    (flags / "slow").touch()
    first = tmp_path / "first.json"
    proc = start_job(tmp_path, host, first)
    try:
        assert _wait_for(tmp_path / "started"), "the job never reached its second gate"
    finally:
        kill_job(proc)
    held = ResultsFile.load(first)  # complete, valid, and the killed gate is in no version
    assert [gate.name for gate in held.phases[0].gates] == ["build"]
    assert coverage(first) == {"covered": ["build"], "not_covered": ["check", "bench"], "only": None,
                               "finished": False}
    (flags / "slow").unlink()
    second = tmp_path / "second.json"
    assert job(runner_env, host, second, "--only", "check,bench").exit_code == 0
    result = cli(runner_env, repo.root, "advance", "--results", str(first), "--results", str(second))
    assert result.exit_code == 0, result.text
    assert load_plan(repo.plan).plan.phase("alpha").status == "complete"


def test_the_file_is_complete_whenever_the_job_is_killed(tmp_path):
    phases = default_phases()
    phases[0]["gates"] = [gate(f"g{i}", "verify", "sleep 0.2") for i in range(5)]
    repo = make_repo(tmp_path / "repo", phases, git_init=False)
    out = tmp_path / "out.json"
    t0 = time.monotonic()
    assert start_job(tmp_path, repo.root, out).wait(300) == 0
    typical = time.monotonic() - t0
    rng = random.Random(20261206)
    seen = set()
    for trial in range(12):
        out = tmp_path / f"out{trial}.json"
        proc = start_job(tmp_path, repo.root, out)
        time.sleep(rng.uniform(0.2, typical))
        kill_job(proc)
        if not out.exists():
            seen.add(-1)
            continue
        held = ResultsFile.load(out)  # never half-written: loads (its coverage consistent with its gates)
        [phase] = held.phases
        names = [gate.name for gate in phase.gates]
        assert names == [f"g{i}" for i in range(len(names))]
        assert phase.coverage is None or phase.coverage.not_covered == [f"g{i}" for i in range(len(names), 5)]
        seen.add(len(names))
    assert seen & {1, 2, 3, 4}, seen  # some kills landed between gates: those files hold what had finished


def test_sigterm_keeps_the_finished_gates_and_says_how_to_run_the_rest(tmp_path, runner_env):
    repo, host, flags = slow_repo(tmp_path)
    (flags / "slow").touch()
    out = tmp_path / "first.json"

    def terminate_when_started():
        if _wait_for(tmp_path / "started"):
            os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=terminate_when_started)
    thread.start()
    result = job(runner_env, host, out)
    thread.join()
    assert result.exit_code == 130, result.text
    assert f"interrupted: {out} keeps the 1 gate(s) that finished before the interrupt" in result.stderr
    assert f"runner gate alpha --only check,bench --out OTHER.json, then runner advance --results {out}" in result.stderr
    assert [gate["name"] for gate in json.loads(out.read_text())["phases"][0]["gates"]] == ["build"]


def test_a_gate_that_changes_the_tree_stops_the_writing(tmp_path, runner_env):
    phases = default_phases()
    phases[0]["gates"] = [gate("build", "build", "true"), gate("edit", "verify", "echo x >> src/code.py"),
                          gate("late", "verify", "true")]
    repo = make_repo(tmp_path / "repo", phases, git_init=False)
    out = tmp_path / "out.json"
    result = cli(runner_env, repo.root, "gate", "alpha", "--out", str(out))
    assert result.exit_code == 1
    assert f"{out} keeps the 1 gate(s) that finished before it changed" in result.stderr
    assert coverage(out) == {"covered": ["build"], "not_covered": ["edit", "late"], "only": None, "finished": False}


def test_a_job_that_finishes_no_gate_leaves_an_earlier_file_alone(tmp_path, runner_env):
    repo, host, flags = slow_repo(tmp_path)
    out = tmp_path / "r.json"
    out.write_text("an earlier job's file\n")
    phases = default_phases()
    phases[0]["gates"] = [gate("edit", "build", "echo x >> src/code.py")]
    edited = make_repo(tmp_path / "edited", phases, git_init=False)
    result = cli(runner_env, edited.root, "gate", "alpha", "--out", str(out))
    assert result.exit_code == 1 and "the results file was not written" in result.stderr
    assert out.read_text() == "an earlier job's file\n"


@pytest.mark.parametrize(("args", "needle"), [
    (["alpha", "--only", "nope"], "--only names nope, which no phase checked here has (gates: alpha: build, check, bench)"),
    (["--completed", "--only", "build"], "name them instead of --completed"),
    (["alpha", "beta", "--only", "build"], "phase beta has none of the gates --only names (build)"),
    (["alpha", "--only", ","], "--only takes GATE[,GATE...]"),
])
def test_only_refuses_what_it_cannot_mean(tmp_path, runner_env, args, needle):
    repo, host, _ = split_repo(tmp_path)
    result = cli(runner_env, host, "gate", *args)
    assert result.exit_code == 2, result.text
    assert needle in result.stderr, result.stderr


def test_only_may_be_repeated(tmp_path, runner_env):
    repo, host, _ = split_repo(tmp_path)
    out = tmp_path / "r.json"
    assert job(runner_env, host, out, "--only", "check", "--only", "build").exit_code == 0
    assert coverage(out)["covered"] == ["build", "check"]


def test_a_partial_file_in_the_tree_is_named_and_one_under_reports_combines(tmp_path, runner_env):
    repo, host, _ = split_repo(tmp_path)
    inside = host / "r1.json"
    result = job(runner_env, host, inside, "--only", "build,check")
    assert result.exit_code == 0 and f"note: {inside} lies in the tree" in result.text, result.text
    later = job(runner_env, host, tmp_path / "r2.json", "--only", "bench")
    assert ResultsFile.load(tmp_path / "r2.json").fingerprint != ResultsFile.load(inside).fingerprint
    refused = cli(runner_env, repo.root, "advance", "--results", str(inside), "--results", str(tmp_path / "r2.json"))
    assert refused.exit_code == 2 and "an earlier job left inside the tree" in refused.stderr, refused.text
    inside.unlink()
    kept = [host / "reports" / "r1.json", host / "reports" / "r2.json"]  # the fingerprint leaves reports/ out
    for out, only in zip(kept, ("build,check", "bench")):
        result = job(runner_env, host, out, "--only", only)
        assert result.exit_code == 0 and "lies in the tree" not in result.text, result.text
    assert later.exit_code == 0
    result = cli(runner_env, repo.root, "advance", "--results", str(kept[0]), "--results", str(kept[1]))
    assert result.exit_code == 0, result.text


def test_a_disk_that_refuses_a_write_stops_no_gate(tmp_path, runner_env):
    import errno

    from runner.records import results as results_module

    repo, host, _ = split_repo(tmp_path)
    real_dump, calls = results_module.ResultsFile.dump, []

    def full_once(self, path):  # the disk is full for the first write only
        calls.append(path)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_dump(self, path)

    runner_env.setattr(results_module.ResultsFile, "dump", full_once)
    out = tmp_path / "r.json"
    result = job(runner_env, host, out)
    assert result.exit_code == 0, result.text
    assert len(calls) == 4 and coverage(out) is None  # three gates, then the final write
    runner_env.setattr(results_module.ResultsFile, "dump", lambda self, path: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device")))
    refused = job(runner_env, host, tmp_path / "never.json")
    assert refused.exit_code == 2 and "cannot write --out" in refused.stderr and "No space left" in refused.stderr
