"""``runner gate``: the read-only check. No file changes, no commit, no lock; worst exit code."""

from __future__ import annotations

import json

from runner.gates.execute import run_gate
from runner.records.results import ResultsFile
from tests.runner.gate_helpers import make_gate
from tests.runner.repo_fixtures import (
    cli,
    copy_without_git,
    default_phases,
    gate,
    make_repo,
    snapshot,
    write,
)


def test_gate_changes_nothing_and_commits_nothing(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    write(repo.root, "unrelated.txt", "dirty\n")
    before_files, before_status, head = snapshot(repo.root), repo.porcelain(), repo.head()
    result = cli(runner_env, repo.root, "gate", "alpha")
    assert result.exit_code == 0, result.text
    assert "alpha PASS" in result.stdout
    assert snapshot(repo.root) == before_files
    assert repo.porcelain() == before_status and repo.head() == head
    assert repo.git("tag", "--list") == ""


def test_gate_out_writes_results_bound_to_the_tree(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    out = tmp_path / "out" / "results.json"
    result = cli(runner_env, repo.root, "gate", "alpha", "--out", str(out))
    assert result.exit_code == 0, result.text
    results = ResultsFile.load(out)
    assert results.plan_id == "demo" and results.machine.hostname == "testhost"
    assert results.fingerprint.startswith("sha256:")
    [phase] = results.phases
    assert [(g.name, g.outcome) for g in phase.gates] == [("build", "PASS"), ("check", "PASS")]
    assert "building" in phase.gates[0].log_tail  # tails kept although the logs were deleted
    assert results.fingerprint in result.stdout


def test_gate_logs_folder_keeps_the_logs(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    logs = tmp_path / "logs"
    assert cli(runner_env, repo.root, "gate", "alpha", "--logs", str(logs)).exit_code == 0
    assert (logs / "alpha" / "build.log").read_text().startswith("building")


def test_gate_runs_in_a_copy_without_git(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    host = copy_without_git(repo.root, tmp_path / "host")
    before = snapshot(host)
    result = cli(runner_env, host, "gate", "alpha")
    assert result.exit_code == 0, result.text
    assert snapshot(host) == before


def test_no_phase_and_no_flag_is_a_usage_error_listing_phases(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    result = cli(runner_env, repo.root, "gate")
    assert result.exit_code == 2
    assert "alpha" in result.stderr and "beta" in result.stderr and "--completed" in result.stderr
    unknown = cli(runner_env, repo.root, "gate", "nope")
    assert unknown.exit_code == 2 and "no phase 'nope'" in unknown.stderr


def test_worst_outcome_decides_the_exit_code(tmp_path, runner_env):
    phases = default_phases()
    phases[0]["gates"] = [gate("bad", "verify", "exit 4")]
    repo = make_repo(tmp_path / "repo", phases)
    blocked = cli(runner_env, repo.root, "gate", "beta")
    assert blocked.exit_code == 3, blocked.text
    assert "runner gate beta --out results.json" in blocked.stderr
    both = cli(runner_env, repo.root, "gate", "beta", "alpha")
    assert both.exit_code == 1, both.text
    assert "exited with code 4" in both.stderr


def test_completed_runs_every_complete_phase(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    none_yet = cli(runner_env, repo.root, "gate", "--completed")
    assert none_yet.exit_code == 0 and "nothing to check" in none_yet.text
    assert cli(runner_env, repo.root, "advance").exit_code == 0
    before = snapshot(repo.root)
    out = tmp_path / "ci.json"
    result = cli(runner_env, repo.root, "gate", "--completed", "--out", str(out))
    assert result.exit_code == 0, result.text
    assert [p["phase"] for p in json.loads(out.read_text())["phases"]] == ["alpha"]
    assert snapshot(repo.root) == before


def test_gate_that_edits_the_tree_gives_no_results(tmp_path, runner_env):
    phases = default_phases()
    phases[0]["gates"] = [gate("edit", "build", "echo x >> src/code.py")]
    repo = make_repo(tmp_path / "repo", phases)
    out = tmp_path / "results.json"
    result = cli(runner_env, repo.root, "gate", "alpha", "--out", str(out))
    assert result.exit_code == 1
    assert "tree changed" in result.stderr and not out.exists()


# --- progress reporting (execute's on_progress) -------------------------------------------------


def test_progress_lines_reach_the_callback(tmp_path):
    seen = []
    code = (
        'for i in 1 2 3; do printf \'{"done": %d, "total": 3}\\n\' $i >> "$RUNNER_PROGRESS"; '
        "sleep 0.3; done"
    )
    res = run_gate(
        make_gate(run=code),
        repo_root=tmp_path,
        log_path=tmp_path / "g.log",
        on_progress=lambda name, elapsed, done, total: seen.append((name, done, total)),
    )
    assert res.outcome == "PASS", res.reason
    assert seen and all(name == "g" for name, _, _ in seen)
    counts = [(done, total) for _, done, total in seen if done is not None]
    assert counts and counts == sorted(counts) and counts[-1] in {(2, 3), (3, 3)}


def test_gate_refuses_a_call_that_names_missing_code_before_running_anything(tmp_path, runner_env):
    phases = default_phases()
    phases[0]["gates"].append(gate("later", "benchmark", run=None, call="gates.missing:run"))
    repo = make_repo(tmp_path / "repo", phases)
    result = cli(runner_env, repo.root, "gate", "alpha", "--out", str(tmp_path / "r.json"))
    assert result.exit_code == 2, result.text
    assert "no module named 'gates'" in result.stderr and "demo.md:" in result.stderr
    assert not (tmp_path / "r.json").exists()
