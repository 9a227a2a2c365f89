"""A results file is data from another machine: every malformed, inconsistent or hostile file
is one ``ResultsError`` naming the problem, never a traceback, a hang or a huge allocation."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from runner.errors import ResultsError
from runner.records.results import MAX_RESULTS_BYTES, ResultsFile
from tests.runner.repo_fixtures import cli, copy_without_git, edit_results, gpu_phases, make_repo
from tests.runner.run_samples import gate_result, results


def good() -> dict:
    run = results(run_id="20261130T000000Z-00000001", created="2026-11-30T00:00:00Z", gates=[
        gate_result("build", "build"),
        gate_result("check", "verify", metrics={"speedup": 2.5}),
    ])
    return json.loads(json.dumps(run.model_dump(mode="python")))


def write(tmp_path: Path, data) -> Path:
    path = tmp_path / "results.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def gates(data: dict) -> list[dict]:
    return data["phases"][0]["gates"]


def test_the_good_file_loads(tmp_path):
    assert ResultsFile.load(write(tmp_path, good())).phases[0].outcome == "PASS"


def _dup_gate(d):
    gates(d).append(copy.deepcopy(gates(d)[1]))
    gates(d)[1]["metrics"] = {"speedup": 0.1}


def _dup_phase(d):
    d["phases"].append(copy.deepcopy(d["phases"][0]))


def _set(gate_index, **fields):
    def change(d):
        gates(d)[gate_index].update(fields)
        d["phases"][0].pop("outcome", None)  # derived again from the gates
    return change


@pytest.mark.parametrize("change, needle", [
    (_dup_gate, "appears 2 times"),
    (_dup_phase, "appears 2 times"),
    (_set(1, exit_code=1), "PASS but exit code 1"),
    (_set(1, exit_code=None, signal="SIGKILL"), "PASS but exit code"),
    (_set(1, exit_code=None), "PASS but exit code None"),
    (_set(0, outcome="SKIPPED"), "a process ran"),
    (_set(0, outcome="FAIL", exit_code=1, signal="SIGSEGV"), "both an exit code and a signal"),
    (_set(0, kind="deploy"), "unknown kind"),
    (_set(1, checks=[{"metric": "speedup", "threshold": ">= 1.5", "value": 0.1, "ok": False, "reason": "x"}]),
     "failed check"),
    (_set(1, exit_code="0"), "exit_code"),
    (_set(1, exit_code=True), "exit_code"),
    (_set(1, duration_s="1.5"), "duration_s"),
    (_set(1, outcome="pass"), "outcome"),
    (lambda d: d["machine"].update(cpu_count="8"), "cpu_count"),
    (lambda d: d.update(phases={}), "phases"),
])
def test_inconsistent_or_mistyped_files_are_refused(tmp_path, change, needle):
    data = good()
    change(data)
    with pytest.raises(ResultsError, match="results") as info:
        ResultsFile.load(write(tmp_path, data))
    assert needle in str(info.value)


def _text(d: dict) -> str:
    return json.dumps(d)


@pytest.mark.parametrize("make, needle", [
    (lambda: _text(good()).replace('"speedup": 2.5', '"speedup": 1' + "0" * 5000), "digits"),
    (lambda: _text(good()).replace('"speedup": 2.5', '"speedup": 1' + "0" * 320), "range of a float"),
    (lambda: _text(good()).replace('"test"', '"\\ud800"'), "surrogate"),
    (lambda: _text(good()).replace('"speedup": 2.5', '"speedup": ' + "[" * 5000 + "]" * 5000), "levels deep"),
    (lambda: _text(good())[:-1] + ', "tool": "forged"}', "repeats the key"),
    (lambda: _text(good()).replace('"outcome": "PASS"', '"outcome": "FAIL", "outcome": "PASS"', 1), "repeats the key"),
    (lambda: "[]", "JSON object"),
    (lambda: "{", "not valid JSON"),
])
def test_hostile_json_is_refused(tmp_path, make, needle):
    with pytest.raises(ResultsError) as info:
        ResultsFile.load(write(tmp_path, make()))
    assert needle in str(info.value)
    assert len(str(info.value)) < 1000


def test_not_a_regular_file_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "results.json"
    os.mkfifo(fifo)
    with pytest.raises(ResultsError, match="FIFO"):
        ResultsFile.load(fifo)
    with pytest.raises(ResultsError, match="folder"):
        ResultsFile.load(tmp_path)
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(ResultsError, match="symbolic link"):
        ResultsFile.load(link)


def test_oversized_file_is_refused_before_reading(tmp_path):
    path = tmp_path / "results.json"
    with open(path, "wb") as handle:
        handle.truncate(MAX_RESULTS_BYTES + 1)
    with pytest.raises(ResultsError, match="over the"):
        ResultsFile.load(path)


def test_invalid_utf8_is_refused(tmp_path):
    path = tmp_path / "results.json"
    path.write_bytes(_text(good()).replace('"r1"', '"r\\u0031"').encode().replace(b"test", b"t\xffst"))
    with pytest.raises(ResultsError, match="UTF-8"):
        ResultsFile.load(path)


# --- against the plan (advance --results) -----------------------------------------------------


def _extra_gate(phase):
    extra = copy.deepcopy(phase["gates"][0])
    extra["name"] = "smuggled"
    phase["gates"].append(extra)


def _swap(phase):
    phase["gates"].reverse()


def _rekind(phase):
    phase["gates"][0]["kind"] = "benchmark"


@pytest.mark.parametrize("change, needle", [
    (_extra_gate, "'smuggled' is not a gate of this phase"),
    (_rekind, "recorded as benchmark"),
    (_swap, "not the order a run of the plan takes"),
])
def test_results_that_do_not_match_the_plans_gates_are_refused(gpu_results, runner_env, change, needle):
    repo, results = gpu_results
    edit_results(results, change)
    result = cli(runner_env, repo.root, "advance", "--results", str(results))
    assert result.exit_code == 2, result.text
    assert needle in result.stderr and "Traceback" not in result.text
    assert repo.commit_count() == 1


def test_results_of_a_plan_listing_verify_before_build_are_accepted(tmp_path, runner_env):
    """A run executes build gates first whatever order the plan lists them in (the shipped
    plan lists its CPU verify gate first): the runner's own results must import."""
    phases = gpu_phases()
    phases[0]["gates"].reverse()  # verify listed before build
    repo = make_repo(tmp_path / "repo", phases)
    host = copy_without_git(repo.root, tmp_path / "gpuhost")
    runner_env.setenv("RUNNER_DEVICES", "cpu,cuda")
    made = cli(runner_env, host, "gate", "alpha", "--out", "results.json")
    runner_env.setenv("RUNNER_DEVICES", "cpu")
    assert made.exit_code == 0, made.text
    recorded = [g.name for g in ResultsFile.load(host / "results.json").phases[0].gates]
    assert recorded == ["build", "check"]
    result = cli(runner_env, repo.root, "advance", "--results", str(host / "results.json"))
    assert result.exit_code == 0, result.text
    assert repo.commit_count() == 2
