"""What a run may record: a run that could only block keeps an earlier verdict in the plan,
and a run of a phase that waits is kept as evidence without changing any status."""

from __future__ import annotations

import json

from runner.errors import ExitCode
from runner.plan.load import load_plan
from runner.plan.rewrite import PhaseUpdate, render_updates
from tests.runner.repo_fixtures import (
    METRICS_OK,
    cli,
    copy_without_git,
    default_phases,
    gate,
    make_repo,
)


def _gpu_phases():
    """alpha: a CPU build and a cuda check that fails on the GPU (thresholds missed)."""
    phases = default_phases()
    phases[0]["gates"] = [
        gate("build", "build", "echo building"),
        gate("check", "verify", METRICS_OK, requires=["cuda"], expect={"speedup": ">= 9"}),
    ]
    return phases


def _failed_on_gpu(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", _gpu_phases())
    runner_env.setenv("RUNNER_DEVICES", "cpu,cuda")
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == ExitCode.GATE_FAILED, result.text
    repo.git("add", "-A")
    repo.git("commit", "-q", "-m", "the GPU run")
    runner_env.setenv("RUNNER_DEVICES", "cpu")
    return repo


def test_a_blocked_run_keeps_the_plans_failed_and_changes_no_tracked_file(tmp_path, runner_env):
    repo = _failed_on_gpu(tmp_path, runner_env)
    plan_before = repo.plan.read_bytes()
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == ExitCode.BLOCKED, result.text
    assert repo.git("status", "--porcelain", "--untracked-files=no") == ""
    assert repo.plan.read_bytes() == plan_before
    assert "keeps failed" in result.stderr
    runs = sorted((repo.root / "reports" / "demo" / "alpha").iterdir())
    assert len(runs) == 2
    meta = json.loads((runs[-1] / "run.json").read_text())
    assert meta["recorded"] is False and meta["role"] == "run"
    assert "keeps" in (runs[-1] / "report.md").read_text()

    runner_env.setattr("socket.gethostname", lambda: "testhost")  # the fake machine's name
    status = cli(runner_env, repo.root, "status")
    line = next(line for line in status.stdout.splitlines() if "alpha:" in line)
    assert "failed on Test GPU (run " in line
    assert "blocked here (run " in line and "1 gate passed, 1 blocked" in line

    cli(runner_env, repo.root, "report", "--out", str(tmp_path / "index.html"))
    html = (tmp_path / "index.html").read_text()
    assert "run(s): <a" in html and "at " in html
    latest = html[html.index("Latest of 2 run(s)"):]
    assert latest.index("on testhost: Test GPU") < latest.index("Also: blocked run")  # the GPU run leads


def test_a_blocked_run_of_a_pending_phase_still_records_blocked(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", _gpu_phases())
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == ExitCode.BLOCKED, result.text
    assert load_plan(repo.plan).plan.phase("alpha").status == "blocked"


def test_a_failed_run_still_replaces_the_status(tmp_path, runner_env):
    phases = default_phases()
    phases[0]["gates"] = [gate("build", "build", "exit 1")]
    repo = make_repo(tmp_path / "repo", phases)
    cli(runner_env, repo.root, "advance")
    assert load_plan(repo.plan).plan.phase("alpha").status == "failed"
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == ExitCode.GATE_FAILED
    assert load_plan(repo.plan).plan.phase("alpha").status == "failed"


# --- evidence for a phase that waits ------------------------------------------------------------


def _waiting_phases():
    """alpha (next, pending) and beta, whose gate runs anywhere and reports a metric."""
    phases = default_phases()
    phases[1]["gates"] = [gate("probe", "verify", METRICS_OK, expect={"speedup": ">= 1.5"})]
    phases[1]["headline"] = ["speedup"]
    return phases


def test_local_evidence_for_a_waiting_phase(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", _waiting_phases())
    base = repo.head()
    result = cli(runner_env, repo.root, "advance", "--phase", "beta", "--evidence")
    assert result.exit_code == 0, result.text
    assert "waiting on alpha" in result.text
    assert repo.head() == base and repo.git("tag", "-l") == ""
    assert repo.git("status", "--porcelain", "--untracked-files=no") == ""
    [run] = list((repo.root / "reports" / "demo" / "beta").iterdir())
    assert json.loads((run / "run.json").read_text())["role"] == "evidence"
    assert "(evidence)" in (run / "report.md").read_text()

    status = cli(runner_env, repo.root, "status").stdout
    line = next(line for line in status.splitlines() if "beta:" in line)
    assert line.strip().startswith("beta: pending; evidence: PASS on ") and "waiting on alpha" in line
    assert "speedup=2.5" in status

    history = cli(runner_env, repo.root, "history")
    assert "evidence (waiting on alpha)" in history.stdout
    assert "speedup=2.5" in history.stdout  # the phase's headline metrics
    cli(runner_env, repo.root, "report", "--out", str(tmp_path / "index.html"))
    assert "evidence" in (tmp_path / "index.html").read_text()
    diff = cli(runner_env, repo.root, "diff", run.name, str(run))
    assert "evidence" in diff.stdout


def test_advance_without_evidence_refuses_a_later_phase(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", _waiting_phases())
    result = cli(runner_env, repo.root, "advance", "--phase", "beta")
    assert result.exit_code == ExitCode.USAGE
    assert "--evidence" in result.stderr
    result = cli(runner_env, repo.root, "advance", "--phase", "alpha", "--evidence")
    assert result.exit_code == ExitCode.USAGE and "next phase" in result.stderr
    assert not (repo.root / "reports").exists()


def test_imported_evidence_is_matched_and_rechecked(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", _waiting_phases())
    host = copy_without_git(repo.root, tmp_path / "host")
    out = tmp_path / "results.json"
    assert cli(runner_env, host, "gate", "beta", "--out", str(out)).exit_code == 0
    plain = cli(runner_env, repo.root, "advance", "--results", str(out))
    assert plain.exit_code == ExitCode.USAGE and "--evidence" in plain.stderr

    data = json.loads(out.read_text())
    forged = tmp_path / "forged.json"
    data["phases"][0]["gates"][0]["metrics"]["speedup"] = 1.0
    forged.write_text(json.dumps(data))
    refused = cli(runner_env, repo.root, "advance", "--evidence", "--results", str(forged))
    assert refused.exit_code == ExitCode.USAGE and "speedup" in refused.stderr

    result = cli(runner_env, repo.root, "advance", "--evidence", "--results", str(out))
    assert result.exit_code == 0, result.text
    assert load_plan(repo.plan).plan.phase("beta").status == "pending"
    assert repo.git("status", "--porcelain", "--untracked-files=no") == ""
    (repo.root / "src" / "code.py").write_text("VALUE = 2\n")
    moved = cli(runner_env, repo.root, "advance", "--evidence", "--results", str(out))
    assert moved.exit_code == ExitCode.USAGE and "tree" in moved.stderr


def test_an_interrupted_run_does_not_become_the_verdict(tmp_path, runner_env):
    from runner.views.runs import find_runs, phase_runs

    repo = _failed_on_gpu(tmp_path, runner_env)
    [gpu_run] = list((repo.root / "reports" / "demo" / "alpha").iterdir())
    later = repo.root / "reports" / "demo" / "alpha" / "20991231T000000Z-ffffffff"
    later.mkdir()
    data = json.loads((gpu_run / "results.json").read_text())
    data["run_id"], data["created"] = later.name, "2099-12-31T00:00:00Z"
    (later / "results.json").write_text(json.dumps(data))
    (later / "run.json").write_text(json.dumps({"role": "run", "recorded": False, "reason": "interrupted"}))
    runs = phase_runs(find_runs(repo.root, "demo"))["alpha"]
    assert runs.verdict.path.parent == gpu_run


def _passed_on_gpu_then_blocked_here(tmp_path, runner_env):
    """alpha passes on the GPU but its check edits the tree, so no checkpoint is made and the
    plan says failed; the phase is re-opened and a CPU machine records ``blocked``."""
    phases = default_phases()
    phases[0]["gates"] = [
        gate("build", "build", "echo building"),
        gate("check", "verify", "echo '# touched' >> src/code.py; " + METRICS_OK, requires=["cuda"],
             expect={"speedup": ">= 1.5"}),
    ]
    repo = make_repo(tmp_path / "repo", phases)
    runner_env.setenv("RUNNER_DEVICES", "cpu,cuda")
    assert cli(runner_env, repo.root, "advance").exit_code == ExitCode.GATE_FAILED
    [passed] = list((repo.root / "reports" / "demo" / "alpha").iterdir())
    assert json.loads((passed / "results.json").read_text())["phases"][0]["outcome"] == "PASS"
    repo.git("checkout", "--", "src/code.py")
    repo.plan.write_text(render_updates(load_plan(repo.plan), {"alpha": PhaseUpdate("pending")}))
    repo.git("add", "-A")
    repo.git("commit", "-q", "-m", "the GPU run, alpha re-opened")
    runner_env.setenv("RUNNER_DEVICES", "cpu")
    assert cli(runner_env, repo.root, "advance").exit_code == ExitCode.BLOCKED
    assert load_plan(repo.plan).plan.phase("alpha").status == "blocked"
    return repo, passed.name


def test_a_passing_run_never_reads_as_why_a_phase_is_blocked(tmp_path, runner_env):
    repo, passed = _passed_on_gpu_then_blocked_here(tmp_path, runner_env)
    runner_env.setattr("socket.gethostname", lambda: "testhost")
    status = cli(runner_env, repo.root, "status")
    line = next(line for line in status.stdout.splitlines() if "alpha:" in line)
    assert f"blocked on Test GPU (run {passed})" not in line
    assert "alpha: blocked (run " in line and "1 gate passed, 1 blocked" in line
    assert f"; last passed on Test GPU (run {passed})" in line
