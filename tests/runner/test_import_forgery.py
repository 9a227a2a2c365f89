"""Imported results cannot forge a checkpoint: a gate rewritten as SKIPPED, a run id that does
not name its tree, or a time that does not match the run id is refused before anything is
written."""

from __future__ import annotations

import json

import pytest

from runner.plan.load import load_plan
from tests.runner.repo_fixtures import cli, edit_results


def _refused(repo, results, runner_env, *needles):
    head = repo.head()
    result = cli(runner_env, repo.root, "advance", "--results", str(results))
    assert result.exit_code == 2, result.text
    for needle in needles:
        assert needle in result.stderr, result.stderr
    assert repo.head() == head and repo.git("tag", "--list") == ""
    assert load_plan(repo.plan).plan.phase("alpha").status == "pending"
    assert not (repo.root / "reports").exists()


def _skip(gate: dict) -> None:
    gate.update(outcome="SKIPPED", reason="not run", metrics={}, checks=[], exit_code=None, signal=None,
                log=None, artifacts={})


def test_a_gate_rewritten_as_skipped_does_not_checkpoint(gpu_results, runner_env):
    repo, results = gpu_results

    def forge(phase):
        _skip(phase["gates"][1])
        phase.pop("outcome", None)
    edit_results(results, forge)
    _refused(repo, results, runner_env, "gate 'check' is SKIPPED, but no gate before it failed")


def test_a_gate_skipped_after_a_failure_is_recorded_as_the_failure(gpu_results, runner_env):
    repo, results = gpu_results

    def fail_build(phase):
        phase["gates"][0].update(outcome="FAIL", reason="exit code 1", exit_code=1)
        _skip(phase["gates"][1])
        phase.pop("outcome", None)
    edit_results(results, fail_build)
    result = cli(runner_env, repo.root, "advance", "--results", str(results))
    assert result.exit_code == 1, result.text
    assert load_plan(repo.plan).plan.phase("alpha").status == "failed"
    assert repo.git("tag", "--list") == ""


def _edit_identity(path, **fields):
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data))


def test_a_run_id_that_does_not_name_its_tree_is_refused(gpu_results, runner_env):
    repo, results = gpu_results
    run_id = json.loads(results.read_text())["run_id"]
    _edit_identity(results, run_id=run_id[:-8] + "deadbeef")
    _refused(repo, results, runner_env, "ends in deadbeef, but a run of tree")


@pytest.mark.parametrize("run_id_time", ["20191130T000000Z", "20261340T000000Z"])
def test_a_created_time_other_than_the_run_ids_is_refused(gpu_results, runner_env, run_id_time):
    repo, results = gpu_results
    run_id = json.loads(results.read_text())["run_id"]
    _edit_identity(results, run_id=run_id_time + run_id[16:])
    _refused(repo, results, runner_env, f"run id {run_id_time}")
