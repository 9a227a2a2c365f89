"""Interrupted runners: Ctrl-C keeps the evidence and the plan; SIGKILL at any moment leaves
the plan whole and the repository consistent, and the next ``runner advance`` carries on."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from runner.plan.load import load_plan
from runner.repo import checkpoint
from tests.runner.gate_helpers import group_alive, sigint_raises
from tests.runner.repo_fixtures import (
    METRICS_OK,
    Repo,
    cli,
    default_phases,
    fake_machine,
    gate,
    make_repo,
)

ROOT = Path(__file__).resolve().parents[2]


def _wait_for(path: Path, seconds: float = 300.0) -> bool:
    """Wait for ``path`` to appear: a readiness signal, with a limit only against a hang."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_interrupt_writes_a_report_marked_interrupted(tmp_path, runner_env):
    started = tmp_path / "started"  # outside the tree; the gate creates it once it is running
    phases = default_phases()
    phases[0]["gates"] = [gate("build", "build", "echo built"),
                          gate("check", "verify", f"echo partial output; touch {started}; exec sleep 600",
                               timeout=60),  # a dropped SIGINT ends the gate (and fails the test) here
                          gate("late", "verify", "true")]
    repo = make_repo(tmp_path / "repo", phases)
    before = repo.plan.read_bytes()

    def interrupt_when_started():
        if _wait_for(started):  # never signal before the gate runs, however loaded the machine
            time.sleep(0.3)  # the gate has run a while: its record says so
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=interrupt_when_started)
    thread.start()
    with sigint_raises():
        result = cli(runner_env, repo.root, "advance")
    thread.join()
    assert result.exit_code == 130, result.text
    assert repo.plan.read_bytes() == before and repo.commit_count() == 1
    assert repo.porcelain() == ""  # the plan does not record the run: git ignores its folder
    assert not (repo.root / ".git" / "runner.lock").exists()
    [run_dir] = (repo.root / "reports" / "demo" / "alpha").iterdir()
    assert "partial output" in (run_dir / "check.log").read_text()
    assert "interrupted" in (run_dir / "check.log").read_text()
    gates = json.loads((run_dir / "results.json").read_text())["phases"][0]["gates"]
    assert [(g["name"], g["outcome"]) for g in gates] == [("build", "PASS"), ("check", "ERROR"), ("late", "SKIPPED")]
    assert "interrupted" in gates[1]["reason"]
    assert gates[1]["duration_s"] >= 0.3 and gates[1]["log"] == "check.log"  # how long it ran, its log
    assert "INTERRUPTED" in (run_dir / "report.md").read_text()


def test_interrupted_evidence_keeps_its_report_marked_evidence(tmp_path, runner_env):
    started = tmp_path / "started"
    phases = default_phases()
    phases[1]["gates"] = [gate("wait", "verify", f"touch {started}; exec sleep 600", timeout=60)]
    repo = make_repo(tmp_path / "repo", phases)
    before = repo.plan.read_bytes()

    def interrupt_when_started():
        if _wait_for(started):
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=interrupt_when_started)
    thread.start()
    with sigint_raises():
        result = cli(runner_env, repo.root, "advance", "--evidence", "--phase", "beta")
    thread.join()
    assert result.exit_code == 130, result.text
    assert "interrupted while running the gates of beta" in result.text
    assert repo.plan.read_bytes() == before and repo.commit_count() == 1
    [run_dir] = (repo.root / "reports" / "demo" / "beta").iterdir()
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["role"] == "evidence" and meta["recorded"] is False and meta["reason"].endswith("; interrupted")
    assert "INTERRUPTED" in (run_dir / "report.md").read_text()


# --- SIGKILL at random moments ------------------------------------------------------------------

TRIALS = 50
WORKERS = 2
_SITECUSTOMIZE = """
import os, time
from runner.repo import checkpoint
from runner.records import machine
from tests.runner.repo_fixtures import fake_machine
machine.probe_machine = lambda *args, **kwargs: fake_machine()
_pause = os.environ.get("RUNNER_TEST_PAUSE_AT")
if _pause:  # a readiness signal: at this checkpoint step, say so and wait for the SIGKILL
    step_name, _, marker = _pause.partition(":")

    def _hold(step):
        if step == step_name:
            open(marker, "w").close()
            while True:
                time.sleep(60)

    checkpoint.set_fault_hook(_hold)
"""


def _killable_repo(tmp_path: Path) -> Repo:
    phases = default_phases()
    phases[0]["gates"] = [gate("build", "build", "true"),
                          gate("check", "verify", METRICS_OK, expect={"speedup": ">= 1.5"})]
    phases[1]["gates"] = [gate("docs", "verify", "true")]
    return make_repo(tmp_path / "template", phases)


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)


def _check_consistent(root: Path, base: str, old_plan: bytes) -> None:
    plan = root / "plans" / "demo.md"
    now = plan.read_bytes()
    if now != old_plan:
        alpha = load_plan(plan).plan.phase("alpha")  # parses: never half-written
        assert alpha.status in ("complete", "failed"), alpha.status
    fsck = _git(root, "fsck", "--no-dangling", "--no-progress")
    assert fsck.returncode == 0 and not fsck.stdout.strip(), fsck.stdout + fsck.stderr
    head = _git(root, "rev-parse", "HEAD").stdout.strip()
    if head != base:
        assert _git(root, "rev-parse", "HEAD~1").stdout.strip() == base
        assert "Runner-Phase: alpha" in _git(root, "log", "-1", "--format=%B").stdout
        assert _git(root, "rev-parse", "demo/alpha^{commit}").stdout.strip() == head  # with its tag
        if now == old_plan:  # killed after publishing, before the plan was written: recover ends it
            found = checkpoint.recover(root, plan_rel="plans/demo.md")
            assert found.problems == [], found
            now = plan.read_bytes()
            assert _git(root, "diff", "--cached", "--", "plans").stdout == ""
        assert _git(root, "show", "HEAD:plans/demo.md").stdout.encode() == now
        assert load_plan(plan).plan.phase("alpha").status == "complete"


def test_sigkill_at_random_moments_loses_nothing(tmp_path, runner_env):
    template = _killable_repo(tmp_path)
    base, old_plan = template.head(), template.plan.read_bytes()
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    fake_machine()  # the same fixed machine in the subprocesses

    def start(work: Path, extra: dict[str, str] | None = None) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "runner", "advance"], cwd=work, env={**env, **(extra or {})},
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)

    def settle(proc: subprocess.Popen) -> None:
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 120  # let the git commands it started finish
        while group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)

    def held_at(step: str) -> Path:
        """A run SIGKILLed exactly when it reaches ``step`` of the checkpoint."""
        work = tmp_path / f"held-{step}"
        shutil.copytree(template.root, work, symlinks=True)
        marker = tmp_path / f"at-{step}"
        proc = start(work, {"RUNNER_TEST_PAUSE_AT": f"{step}:{marker}"})
        assert _wait_for(marker), f"the run never reached {step}"
        settle(proc)
        _check_consistent(work, base, old_plan)
        return work

    # the states a kill can leave, each made on purpose: before publishing (the old plan, the
    # lock left behind) and after it (a published checkpoint the work tree does not show yet)
    before_publish = held_at("publish")
    assert (before_publish / ".git" / "runner.lock").exists()
    assert _git(before_publish, "rev-parse", "HEAD").stdout.strip() == base
    assert (before_publish / "plans/demo.md").read_bytes() == old_plan
    after_publish = held_at("index")  # _check_consistent has recover() finish it
    assert _git(after_publish, "rev-parse", "HEAD~1").stdout.strip() == base

    def full_run(number: int) -> float:
        work = tmp_path / f"full{number}"
        shutil.copytree(template.root, work, symlinks=True)
        t0 = time.monotonic()
        assert start(work).wait(600) == 0
        took = time.monotonic() - t0
        _check_consistent(work, base, old_plan)
        assert _git(work, "rev-parse", "HEAD~1").stdout.strip() == base
        return took

    # how long an undisturbed run takes, under the same load as the trials
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        typical = statistics.median(pool.map(full_run, range(WORKERS)))

    rng = random.Random(20261129)
    delays = [rng.uniform(0, typical) for _ in range(TRIALS)]

    def trial(number: int) -> tuple[Path, str]:
        work = tmp_path / f"trial{number}"
        shutil.copytree(template.root, work, symlinks=True)
        proc = start(work)
        time.sleep(delays[number])
        settle(proc)
        _check_consistent(work, base, old_plan)
        if _git(work, "rev-parse", "HEAD").stdout.strip() != base:
            return work, "commit"
        return work, "old plan" if (work / "plans/demo.md").read_bytes() == old_plan else "rewritten plan"

    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        outcomes = list(pool.map(trial, range(TRIALS)))

    locks_left = [work for work, _ in outcomes if (work / ".git" / "runner.lock").exists()]
    # the next advance takes over the stale lock and works, whatever moment the kill hit
    held = [(before_publish, "held before publish"), (after_publish, "held after publish")]
    for work, kind in held + outcomes[:: max(1, TRIALS // 8)] + [(w, "") for w in locks_left[:4]]:
        again = cli(runner_env, work, "advance")
        assert again.exit_code == 0, (work.name, kind, again.text)
        assert not (work / ".git" / "runner.lock").exists()
        assert _git(work, "fsck", "--no-dangling", "--no-progress").returncode == 0
        assert load_plan(work / "plans" / "demo.md").plan.phase("alpha").status == "complete"
