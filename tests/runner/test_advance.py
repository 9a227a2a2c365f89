"""``runner advance`` in throwaway repositories: checkpoint on pass, nothing committed otherwise."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

from runner.errors import ExitCode
from runner.plan.load import load_plan
from tests.runner.repo_fixtures import (
    METRICS_OK,
    PY,
    cli,
    default_phases,
    edit_results,
    gate,
    make_repo,
    write,
)


def phases_with_alpha_gates(*gates):
    phases = default_phases()
    phases[0]["gates"] = list(gates)
    return phases


def run_dirs(repo, phase="alpha"):
    folder = repo.root / "reports" / "demo" / phase
    return sorted(folder.iterdir()) if folder.is_dir() else []


# --- pass -------------------------------------------------------------------------------------


def test_pass_makes_one_checkpoint_commit(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    base = repo.head()
    write(repo.root, "src/code.py", "VALUE = 2\n")  # phase path, modified: committed
    write(repo.root, "src/new.py", "NEW = 1\n")  # phase path, new: committed
    write(repo.root, "unrelated.txt", "unrelated v2\n")  # dirty but not ours: left alone
    write(repo.root, "docs/notes.md", "edited notes\n")  # another phase's path: left alone

    result = cli(runner_env, repo.root, "advance")

    assert result.exit_code == 0, result.text
    assert repo.commit_count() == 2
    assert repo.git("rev-parse", "HEAD~1").strip() == base
    [run_dir] = run_dirs(repo)
    committed = set(repo.git("diff-tree", "--no-commit-id", "--name-only", "-r", "HEAD").split())
    report_files = {f"reports/demo/alpha/{run_dir.name}/{p.name}" for p in run_dir.iterdir()}
    assert committed == {"plans/demo.md", "src/code.py", "src/new.py"} | report_files
    assert {"report.md", "results.json", "build.log", "check.log"} <= {p.name for p in run_dir.iterdir()}
    # the tag names the checkpoint commit
    assert repo.git("rev-parse", "demo/alpha^{commit}").strip() == repo.head()
    # the unrelated edits are still there, uncommitted
    assert (repo.root / "unrelated.txt").read_text() == "unrelated v2\n"
    porcelain = repo.porcelain()
    assert " M unrelated.txt" in porcelain and " M docs/notes.md" in porcelain
    assert "src/" not in porcelain and "plans/" not in porcelain and "reports/" not in porcelain

    message = repo.git("log", "-1", "--format=%B")
    assert message.startswith("demo/alpha: checkpoint (build PASS, check PASS)")
    assert "speedup: 2.5" in message
    for trailer in ("Runner-Plan: demo", "Runner-Phase: alpha", "Runner-Fingerprint: sha256:",
                    "Runner-Machine: sha256:", "Runner-Gates: build=PASS, check=PASS"):
        assert trailer in message
    trailers = repo.git("log", "-1", "--format=%(trailers:only,unfold)")
    assert "Runner-Phase: alpha" in trailers

    plan = load_plan(repo.plan).plan
    alpha = plan.phase("alpha")
    assert alpha.status == "complete"
    record = alpha.checkpoint
    assert record.tag == "demo/alpha" and record.base == base
    assert record.fingerprint.startswith("sha256:") and record.fingerprint in message
    assert record.report == f"reports/demo/alpha/{run_dir.name}/report.md"
    assert record.metrics == {"speedup": 2.5, "errors": 0}
    assert run_dir.name.endswith("-" + record.fingerprint.split(":")[1][:8])
    assert plan.phase("beta").status == "pending"
    # the generated status section was regenerated
    assert "| alpha | First phase | complete | `demo/alpha` |" in repo.plan.read_text()
    results = json.loads((run_dir / "results.json").read_text())
    assert results["fingerprint"] == record.fingerprint
    assert [g["outcome"] for g in results["phases"][0]["gates"]] == ["PASS", "PASS"]


def test_next_advance_moves_on_and_all_complete_is_ok(tmp_path, runner_env):
    phases = default_phases()
    phases[1]["gates"] = [gate("docs", "verify", "true")]
    repo = make_repo(tmp_path / "repo", phases)
    assert cli(runner_env, repo.root, "advance").exit_code == 0
    second = cli(runner_env, repo.root, "advance")
    assert second.exit_code == 0, second.text
    assert repo.git("rev-parse", "demo/beta^{commit}").strip() == repo.head()
    assert repo.commit_count() == 3
    done = cli(runner_env, repo.root, "advance")
    assert done.exit_code == 0 and "complete" in done.text
    assert repo.commit_count() == 3


# --- fail, crash, hang, blocked -----------------------------------------------------------------


def assert_not_committed(repo, base, status):
    assert repo.head() == base
    assert repo.git("tag", "--list") == ""
    assert load_plan(repo.plan).plan.phase("alpha").status == status
    [run_dir] = run_dirs(repo)
    assert (run_dir / "report.md").is_file() and (run_dir / "results.json").is_file()
    return run_dir


def test_failing_threshold_records_failed_without_commit(tmp_path, runner_env):
    failing = gate("check", "verify", METRICS_OK, expect={"speedup": ">= 9"})
    repo = make_repo(tmp_path / "repo", phases_with_alpha_gates(gate("build", "build"), failing))
    base = repo.head()
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == ExitCode.GATE_FAILED, result.text
    run_dir = assert_not_committed(repo, base, "failed")
    report = (run_dir / "report.md").read_text()
    assert "FAIL" in report and "speedup" in report and "is not >= 9" in report


def test_crashing_gate_fails_and_later_gates_are_skipped(tmp_path, runner_env):
    crash = gate("build", "build", f"exec {PY} -c 'import os; os.abort()'")
    repo = make_repo(tmp_path / "repo", phases_with_alpha_gates(crash, gate("check", "verify", METRICS_OK)))
    base = repo.head()
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 1, result.text
    run_dir = assert_not_committed(repo, base, "failed")
    gates = json.loads((run_dir / "results.json").read_text())["phases"][0]["gates"]
    assert [(g["name"], g["outcome"]) for g in gates] == [("build", "FAIL"), ("check", "SKIPPED")]
    assert gates[0]["signal"] == "SIGABRT"
    assert "SIGABRT" in (run_dir / "report.md").read_text()


def test_hanging_gate_times_out(tmp_path, runner_env):
    hang = gate("build", "build", "sleep 30", timeout=1)
    repo = make_repo(tmp_path / "repo", phases_with_alpha_gates(hang))
    base = repo.head()
    started = time.monotonic()
    result = cli(runner_env, repo.root, "advance")
    assert time.monotonic() - started < 15
    assert result.exit_code == 1, result.text
    run_dir = assert_not_committed(repo, base, "failed")
    assert "timed out after 1 s" in (run_dir / "report.md").read_text()


def test_blocked_gate_exits_3_and_says_how_to_finish(tmp_path, runner_env):
    cuda = gate("check", "verify", METRICS_OK, requires=["cuda"], expect={"speedup": ">= 1.5"})
    repo = make_repo(tmp_path / "repo", phases_with_alpha_gates(gate("build", "build"), cuda))
    base = repo.head()
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == ExitCode.BLOCKED, result.text
    assert_not_committed(repo, base, "blocked")
    assert "runner gate alpha --out results.json" in result.stderr
    assert "machine with cuda" in result.stderr
    assert "runner advance --results results.json" in result.stderr


def test_tree_change_during_gates_prevents_the_commit(tmp_path, runner_env):
    editor = gate("build", "build", "echo changed >> src/code.py")
    repo = make_repo(tmp_path / "repo", phases_with_alpha_gates(editor))
    base = repo.head()
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 1, result.text
    run_dir = assert_not_committed(repo, base, "failed")
    assert "tree changed" in result.stderr
    assert "the tree changed while they ran" in (run_dir / "report.md").read_text()


def test_dry_run_changes_nothing(tmp_path, runner_env):
    cuda = gate("check", "verify", "true", requires=["cuda"])
    marker = gate("build", "build", "touch ran.txt")
    repo = make_repo(tmp_path / "repo", phases_with_alpha_gates(marker, cuda))
    before = repo.plan.read_bytes()
    result = cli(runner_env, repo.root, "advance", "--dry-run")
    assert result.exit_code == 0, result.text
    assert "alpha" in result.stdout and "build: run" in result.stdout
    assert "check: blocked" in result.stdout
    assert repo.plan.read_bytes() == before and repo.porcelain() == ""
    assert not (repo.root / "ran.txt").exists() and not (repo.root / "reports").exists()


def test_failed_commit_restores_the_plan(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    base = repo.head()
    before = repo.plan.read_bytes()
    # a pre-existing, unrelated lock on the tag ref makes the tag step fail after the commit
    (repo.root / ".git" / "refs" / "tags" / "demo").mkdir(parents=True)
    (repo.root / ".git" / "refs" / "tags" / "demo" / "alpha.lock").write_text("")
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == ExitCode.USAGE, result.text
    assert "checkpoint commit failed" in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("runner: error:")]
    assert len(errors) == 1 and "Traceback" not in result.text
    assert repo.head() == base
    assert repo.plan.read_bytes() == before


def test_not_a_git_repository_is_a_usage_error(tmp_path, runner_env):
    repo = make_repo(tmp_path / "plain", git_init=False)
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 2
    assert "not a git repository" in result.stderr and "Traceback" not in result.text


def test_sigterm_during_gates_leaves_the_plan_and_releases_the_lock(tmp_path, runner_env):
    slow = gate("build", "build", "touch started; sleep 30")
    repo = make_repo(tmp_path / "repo", phases_with_alpha_gates(slow))
    before = repo.plan.read_bytes()

    def terminate_when_started():
        deadline = time.monotonic() + 10
        while not (repo.root / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=terminate_when_started)
    thread.start()
    started = time.monotonic()
    result = cli(runner_env, repo.root, "advance")
    thread.join()
    assert result.exit_code == 130, result.text
    assert time.monotonic() - started < 15
    assert repo.plan.read_bytes() == before
    assert not (repo.root / ".git" / "runner.lock").exists()
    assert signal.getsignal(signal.SIGTERM) is previous


# --- results from another machine -----------------------------------------------------------------


def test_results_from_a_gpu_host_checkpoint(gpu_results, runner_env):
    repo, results = gpu_results
    base = repo.head()
    local = repo.root / "results.json"  # copied back into the tree: not part of the fingerprint
    local.write_bytes(results.read_bytes())
    result = cli(runner_env, repo.root, "advance", "--results", "results.json")
    assert result.exit_code == 0, result.text
    assert repo.git("rev-parse", "HEAD~1").strip() == base
    assert repo.git("rev-parse", "demo/alpha^{commit}").strip() == repo.head()
    alpha = load_plan(repo.plan).plan.phase("alpha")
    assert alpha.status == "complete" and alpha.checkpoint.metrics == {"speedup": 2.5, "errors": 0}
    report = (repo.root / alpha.checkpoint.report).read_text()
    assert "Test GPU" in report and "testhost" in report
    assert "| size | ms |" in report  # the gate's artifact travelled inside the results
    assert (repo.root / alpha.checkpoint.report).parent.joinpath("artifacts", "check", "bench.md").is_file()
    assert "Runner-Machine: sha256:" in repo.git("log", "-1", "--format=%B")
    assert "?? results.json" in repo.porcelain()  # not committed


def test_results_for_a_changed_tree_are_refused(gpu_results, runner_env):
    repo, results = gpu_results
    write(repo.root, "src/code.py", "VALUE = 3\n")
    result = cli(runner_env, repo.root, "advance", "--results", str(results))
    assert result.exit_code == 2, result.text
    assert "measured on tree" in result.stderr
    assert repo.commit_count() == 1
    assert load_plan(repo.plan).plan.phase("alpha").status == "pending"


def test_results_missing_a_gate_are_refused(gpu_results, runner_env):
    repo, results = gpu_results
    edit_results(results, lambda phase: phase["gates"].pop(0))
    result = cli(runner_env, repo.root, "advance", "--results", str(results))
    assert result.exit_code == 2, result.text
    assert "gate 'build' is missing" in result.stderr
    assert repo.commit_count() == 1


def test_results_that_miss_a_threshold_are_refused_despite_pass(gpu_results, runner_env):
    repo, results = gpu_results

    def lower_speedup(phase):
        phase["gates"][1]["metrics"]["speedup"] = 1.0

    edit_results(results, lower_speedup)
    assert json.loads(results.read_text())["phases"][0]["gates"][1]["outcome"] == "PASS"
    result = cli(runner_env, repo.root, "advance", "--results", str(results))
    assert result.exit_code == 2, result.text
    assert "speedup" in result.stderr and ">= 1.5" in result.stderr
    assert repo.commit_count() == 1
    assert load_plan(repo.plan).plan.phase("alpha").status == "pending"


def test_results_with_a_failed_gate_record_the_failure_without_commit(gpu_results, runner_env):
    repo, results = gpu_results

    def fail_check(phase):
        phase["gates"][1].update(outcome="FAIL", reason="speedup 1.0 is not >= 1.5")
        phase["outcome"] = "FAIL"

    edit_results(results, fail_check)
    result = cli(runner_env, repo.root, "advance", "--results", str(results))
    assert result.exit_code == ExitCode.GATE_FAILED, result.text
    assert repo.commit_count() == 1
    alpha = load_plan(repo.plan).plan.phase("alpha")
    assert alpha.status == "failed" and alpha.checkpoint is None
    reports = list((repo.root / "reports").rglob("report.md"))
    assert len(reports) == 1 and "FAIL" in reports[0].read_text()


def test_results_of_another_plan_are_refused(gpu_results, runner_env):
    repo, results = gpu_results
    data = json.loads(results.read_text())
    data["plan_id"] = "other"
    results.write_text(json.dumps(data))
    result = cli(runner_env, repo.root, "advance", "--results", str(results))
    assert result.exit_code == 2 and "plan 'other'" in result.stderr
