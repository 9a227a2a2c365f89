"""A phase recorded across several jobs: ``runner gate PHASE --only GATE,...`` on the GPU host,
``runner advance --results A --results B`` in the clone. The combined record checkpoints exactly
as a one-file run does; a gate left uncovered, two trees, or two outcomes of one gate never do."""

from __future__ import annotations

import json
import shutil

from runner.plan.load import load_plan
from runner.records.results import ResultsFile
from tests.runner.repo_fixtures import Repo, cli, copy_without_git, fake_machine, gate, make_repo
from tests.runner.split_helpers import committed, coverage, job, split_phases, split_repo, trailers


def status(repo: Repo) -> str:
    return load_plan(repo.plan).plan.phase("alpha").status


def test_only_runs_the_named_gates_and_the_file_says_what_it_covers(tmp_path, runner_env):
    repo, host, flags = split_repo(tmp_path)
    (flags / "check-fails").touch()  # were check run, this job would fail
    out = tmp_path / "r1.json"
    result = job(runner_env, host, out, "--only", "bench,build")
    assert result.exit_code == 0, result.text
    data = json.loads(out.read_text())
    assert [g["name"] for g in data["phases"][0]["gates"]] == ["build", "bench"]  # run order, not the order named
    assert coverage(out) == {"covered": ["build", "bench"], "not_covered": ["check"], "only": ["build", "bench"],
                             "finished": True}
    assert "alpha PASS (2 of 3 gates)" in result.stdout
    assert "not covered: check" in result.text


def test_a_whole_run_file_carries_no_coverage(tmp_path, runner_env):
    repo, host, _ = split_repo(tmp_path)
    out = tmp_path / "all.json"
    assert job(runner_env, host, out).exit_code == 0
    assert "coverage" not in json.loads(out.read_text())["phases"][0]
    assert job(runner_env, host, out, "--only", "build,check,bench").exit_code == 0  # every gate: a whole run
    assert "coverage" not in json.loads(out.read_text())["phases"][0]


def test_two_only_files_checkpoint_exactly_as_one_file_does(tmp_path, runner_env):
    repo, host, _ = split_repo(tmp_path)
    twin = Repo(tmp_path / "twin")
    shutil.copytree(repo.root, twin.root, symlinks=True)  # the same commit, the same tree
    whole, first, second = tmp_path / "whole.json", tmp_path / "first.json", tmp_path / "second.json"
    assert job(runner_env, host, whole).exit_code == 0
    assert job(runner_env, host, first, "--only", "build,check").exit_code == 0
    assert job(runner_env, host, second, "--only", "bench").exit_code == 0

    one = cli(runner_env, repo.root, "advance", "--results", str(whole))
    two = cli(runner_env, twin.root, "advance", "--results", str(first), "--results", str(second))
    assert one.exit_code == 0 and two.exit_code == 0, one.text + two.text
    for checkpointed in (repo, twin):
        assert checkpointed.git("rev-parse", "demo/alpha^{commit}").strip() == checkpointed.head()
        assert checkpointed.commit_count() == 2 and checkpointed.porcelain() == ""
    assert committed(repo) == committed(twin)
    assert trailers(repo) == trailers(twin)
    assert repo.git("rev-parse", "HEAD:src") == twin.git("rev-parse", "HEAD:src")
    assert repo.git("log", "-1", "--format=%s") == twin.git("log", "-1", "--format=%s")
    one_cp, two_cp = (load_plan(r.plan).plan.phase("alpha").checkpoint for r in (repo, twin))
    assert (one_cp.tag, one_cp.fingerprint, one_cp.base, one_cp.metrics) == (
        two_cp.tag, two_cp.fingerprint, two_cp.base, two_cp.metrics)
    [report] = twin.root.glob("reports/demo/alpha/*/report.md")
    text = report.read_text()
    assert "first.json" in text and "second.json" in text and "| ran on |" in text


def test_a_missing_gate_is_named_and_nothing_is_checkpointed(tmp_path, runner_env):
    repo, host, _ = split_repo(tmp_path)
    first = tmp_path / "first.json"
    assert job(runner_env, host, first, "--only", "build,check").exit_code == 0
    result = cli(runner_env, repo.root, "advance", "--results", str(first))
    assert result.exit_code == 3, result.text  # blocked: every covered gate passed, bench was never run
    assert "Not covered by any results file: bench" in result.text
    assert "runner gate alpha --only bench --out FILE" in result.text
    assert repo.git("tag", "--list") == "" and repo.commit_count() == 1
    assert status(repo) == "blocked"
    [results] = repo.root.glob("reports/demo/alpha/*/results.json")
    gates = {g["name"]: g for g in json.loads(results.read_text())["phases"][0]["gates"]}
    assert gates["bench"]["outcome"] == "BLOCKED" and "not covered by any results file" in gates["bench"]["reason"]


def test_a_failing_phase_with_a_gate_missing_is_recorded_failed(tmp_path, runner_env):
    repo, host, flags = split_repo(tmp_path)
    (flags / "check-fails").touch()
    first = tmp_path / "first.json"
    assert job(runner_env, host, first, "--only", "build,check").exit_code == 1
    result = cli(runner_env, repo.root, "advance", "--results", str(first))
    assert result.exit_code == 1, result.text
    assert status(repo) == "failed" and repo.git("tag", "--list") == ""
    assert "Not covered by any results file: bench" in result.text


def test_a_gate_covered_twice_with_two_outcomes_is_refused_naming_both_files(tmp_path, runner_env):
    repo, host, flags = split_repo(tmp_path)
    first, passed, failed = (tmp_path / name for name in ("first.json", "passed.json", "failed.json"))
    assert job(runner_env, host, first, "--only", "build,check").exit_code == 0
    assert job(runner_env, host, passed, "--only", "bench").exit_code == 0
    (flags / "bench-fails").touch()
    assert job(runner_env, host, failed, "--only", "bench").exit_code == 1
    result = cli(runner_env, repo.root, "advance", "--results", str(first), "--results", str(failed),
                 "--results", str(passed))
    assert result.exit_code == 2, result.text
    assert "gate 'bench' is FAIL in failed.json and PASS in passed.json" in result.stderr
    assert not (repo.root / "reports").exists() and status(repo) == "pending"


def test_a_gate_covered_twice_alike_is_kept_from_the_first_file(tmp_path, runner_env):
    repo, host, _ = split_repo(tmp_path)
    first, again = tmp_path / "first.json", tmp_path / "again.json"
    assert job(runner_env, host, first).exit_code == 0
    assert job(runner_env, host, again, "--only", "bench").exit_code == 0
    result = cli(runner_env, repo.root, "advance", "--results", str(first), "--results", str(again))
    assert result.exit_code == 0, result.text
    assert "Gate bench is PASS in first.json and again.json; this record keeps the result of first.json" in result.text
    [results] = repo.root.glob("reports/demo/alpha/*/results.json")
    sources = json.loads(results.read_text())["phases"][0]["sources"]
    assert [(s["file"], s["gates"]) for s in sources] == [("first.json", ["build", "check", "bench"]), ("again.json", [])]


def test_files_of_two_trees_are_refused_naming_both(tmp_path, runner_env):
    repo, host, _ = split_repo(tmp_path)
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    assert job(runner_env, host, first, "--only", "build,check").exit_code == 0
    (host / "src" / "code.py").write_text("VALUE = 2\n")
    assert job(runner_env, host, second, "--only", "bench").exit_code == 0
    result = cli(runner_env, repo.root, "advance", "--results", str(first), "--results", str(second))
    assert result.exit_code == 2, result.text
    assert f"{first} was measured on tree" in result.stderr and f"and {second} on tree" in result.stderr
    assert "must come from one tree" in result.stderr and not (repo.root / "reports").exists()


def test_a_benchmark_counts_only_after_the_verify_gate_passed_in_some_file(tmp_path, runner_env):
    repo, host, flags = split_repo(tmp_path)
    first, bench = tmp_path / "first.json", tmp_path / "bench.json"
    alone = job(runner_env, host, bench, "--only", "bench")  # runs alone: its verify gate may run elsewhere
    assert alone.exit_code == 0, alone.text
    assert "benchmark bench runs without the phase's verify gate(s) check" in alone.text
    (flags / "check-fails").touch()
    assert job(runner_env, host, first, "--only", "build,check").exit_code == 1
    result = cli(runner_env, repo.root, "advance", "--results", str(first), "--results", str(bench))
    assert result.exit_code == 1, result.text
    assert "Benchmark bench ran (PASS) but is not counted: verify gate(s) check (FAIL)" in result.text
    [results] = repo.root.glob("reports/demo/alpha/*/results.json")
    gates = {g["name"]: g for g in json.loads(results.read_text())["phases"][0]["gates"]}
    assert gates["bench"]["outcome"] == "SKIPPED" and gates["bench"]["metrics"] == {}
    assert status(repo) == "failed"


def test_the_machine_of_each_gate_is_in_the_report(tmp_path, runner_env):
    repo, host, _ = split_repo(tmp_path)
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    from runner.records import machine as machine_module

    for name, out, only in (("node-a", first, "build,check"), ("node-b", second, "bench")):
        runner_env.setattr(machine_module, "probe_machine",
                           lambda name=name: fake_machine().model_copy(update={"hostname": name}))
        assert job(runner_env, host, out, "--only", only).exit_code == 0
    result = cli(runner_env, repo.root, "advance", "--results", str(first), "--results", str(second))
    assert result.exit_code == 0, result.text
    [report] = repo.root.glob("reports/demo/alpha/*/report.md")
    rows = {line.split("|")[1].strip(): line for line in report.read_text().splitlines() if line.startswith("| ")}
    assert "node-a: no GPU (first.json)" in rows["check"] and "node-b: no GPU (second.json)" in rows["bench"]
    [results] = repo.root.glob("reports/demo/alpha/*/results.json")
    record = ResultsFile.load(results)
    assert record.phases[0].machine_of("build", record.machine).hostname == "node-a"
    assert record.phases[0].machine_of("bench", record.machine).hostname == "node-b"


def test_a_file_that_lies_about_its_coverage_is_refused(tmp_path, runner_env):
    repo, host, _ = split_repo(tmp_path)
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    assert job(runner_env, host, first, "--only", "build,check").exit_code == 0
    assert job(runner_env, host, second, "--only", "bench").exit_code == 0
    data = json.loads(first.read_text())
    data["phases"][0]["coverage"]["covered"].append("bench")  # claims a gate it does not hold
    first.write_text(json.dumps(data))
    result = cli(runner_env, repo.root, "advance", "--results", str(first), "--results", str(second))
    assert result.exit_code == 2 and "coverage.covered lists" in result.stderr, result.text
    data["phases"][0]["coverage"] = {"covered": ["build", "check"], "not_covered": ["bench", "extra"], "only": None,
                                     "finished": True}
    first.write_text(json.dumps(data))
    result = cli(runner_env, repo.root, "advance", "--results", str(first), "--results", str(second))
    assert result.exit_code == 2 and "'extra' is listed as not covered" in result.stderr, result.text
    del data["phases"][0]["coverage"]  # a whole run's file that misses a gate: refused as it always was
    first.write_text(json.dumps(data))
    result = cli(runner_env, repo.root, "advance", "--results", str(first), "--results", str(second))
    assert result.exit_code == 2 and "gate 'bench' is missing" in result.stderr, result.text
    assert not (repo.root / "reports").exists()


def test_the_same_file_twice_is_refused(tmp_path, runner_env):
    repo, host, _ = split_repo(tmp_path)
    first = tmp_path / "first.json"
    assert job(runner_env, host, first, "--only", "build,check").exit_code == 0
    result = cli(runner_env, repo.root, "advance", "--results", str(first), "--results", str(first))
    assert result.exit_code == 2 and "names the same file" in result.stderr


def test_files_of_several_phases_combine_for_the_phase_advanced(tmp_path, runner_env):
    repo, host, _ = split_repo(tmp_path)
    runner_env.setenv("RUNNER_DEVICES", "cpu,cuda")
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    both = cli(runner_env, host, "gate", "alpha", "beta", "--only", "build,check,gpu", "--out", str(first))
    assert both.exit_code == 0, both.text
    assert [p["phase"] for p in json.loads(first.read_text())["phases"]] == ["alpha", "beta"]
    assert coverage(first, "beta") is None  # beta's one gate ran: the whole phase
    assert job(runner_env, host, second, "--only", "bench").exit_code == 0
    runner_env.setenv("RUNNER_DEVICES", "cpu")
    result = cli(runner_env, repo.root, "advance", "--results", str(first), "--results", str(second))
    assert result.exit_code == 0, result.text
    assert status(repo) == "complete"
    again = cli(runner_env, repo.root, "advance", "--results", str(first))  # beta, from the same file
    assert again.exit_code == 0, again.text
    assert load_plan(repo.plan).plan.phase("beta").status == "complete"


def test_evidence_of_a_waiting_phase_combines_files_too(tmp_path, runner_env):
    flags = tmp_path / "flags"
    flags.mkdir()
    phases = split_phases(flags)
    phases[1]["gates"] = [gate("docs", "build", "true"), gate("gpu", "verify", "true")]
    repo = make_repo(tmp_path / "repo", phases)
    host = copy_without_git(repo.root, tmp_path / "host")
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    assert cli(runner_env, host, "gate", "beta", "--only", "docs", "--out", str(first)).exit_code == 0
    assert cli(runner_env, host, "gate", "beta", "--only", "gpu", "--out", str(second)).exit_code == 0
    part = cli(runner_env, repo.root, "advance", "--evidence", "--results", str(first))
    assert part.exit_code == 3 and "evidence BLOCKED" in part.text and "Not covered by any results file: gpu" in part.text
    whole = cli(runner_env, repo.root, "advance", "--evidence", "--results", str(first), "--results", str(second))
    assert whole.exit_code == 0 and "beta: evidence PASS" in whole.text, whole.text
    assert status(repo) == "pending" and repo.commit_count() == 1
