"""Plans and gates an adversary writes: each ends in a clean refusal or a recorded outcome,
refused before any gate runs when it can be, never in a traceback or a false PASS."""

from __future__ import annotations

import pytest

from runner.plan.load import load_plan
from tests.runner.repo_fixtures import cli, default_phases, make_repo, write


def test_a_callable_whose_module_exits_0_at_import_is_an_error_not_a_pass(tmp_path, runner_env):
    phases = [{"id": "alpha", "title": "A", "status": "pending", "paths": [],
               "gates": [{"name": "g", "kind": "verify", "call": "quits:run"}]}]
    repo = make_repo(tmp_path / "repo", phases, git_init=False)
    write(repo.root, "quits.py", "import os\nos._exit(0)\n\ndef run():\n    return {}\n")
    result = cli(runner_env, repo.root, "gate", "alpha")
    assert result.exit_code == 1, result.text
    assert "ERROR" in result.text and "without reporting that the function ran" in result.text


FLOW_PLAN = """---
schema: 1
id: demo
phases:
  - {id: alpha, status: pending, paths: [src/], gates: [{name: g, kind: verify, run: "touch ran.txt"}]}
---
# Demo
"""


def test_a_phase_the_runner_cannot_rewrite_is_refused_before_its_gates(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    repo.plan.write_text(FLOW_PLAN)
    repo.git("commit", "-qam", "flow style")
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 2, result.text
    assert "flow style" in result.stderr
    assert not (repo.root / "ran.txt").exists()  # no gate ran
    assert not (repo.root / "reports").exists()
    assert repo.plan.read_text() == FLOW_PLAN


@pytest.mark.parametrize("threshold", ["<= 1e309", ">= -1e400", "== 1E+999"])
def test_a_threshold_beyond_a_float_is_refused(tmp_path, runner_env, threshold):
    phases = default_phases()
    phases[0]["gates"][1]["expect"] = {"speedup": threshold}
    repo = make_repo(tmp_path / "repo", phases, git_init=False)
    result = cli(runner_env, repo.root, "status")
    assert result.exit_code == 2, result.text
    assert "plans/demo.md:" in result.stderr and "infinite" in result.stderr


@pytest.mark.parametrize("command", [["status"], ["status", "--json"], ["report"], ["history"],
                                     ["advance", "--dry-run"], ["gate", "alpha"]])
def test_a_lone_surrogate_in_a_plan_is_a_plan_error(tmp_path, runner_env, command):
    repo = make_repo(tmp_path / "repo", git_init=False)
    repo.plan.write_text(repo.plan.read_text().replace("title: Demo plan", 'title: "bad \\ud800 title"'))
    result = cli(runner_env, repo.root, *command)
    assert result.exit_code == 2, result.text
    assert "plans/demo.md:4:8: title:" in result.stderr and "lone surrogate" in result.stderr


def test_a_surrogate_pair_escape_is_one_character(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", git_init=False)
    repo.plan.write_text(repo.plan.read_text().replace("title: Demo plan", 'title: "plan \\ud83d\\ude00"'))
    assert load_plan(repo.plan).plan.title == "plan \U0001F600"


@pytest.mark.parametrize("bad_id", ["alpha-", "alpha.", "-alpha"])
def test_ids_are_their_own_folder_names(tmp_path, runner_env, bad_id):
    """A phase id ending in "-" used to lose it in its reports folder's name, after which every
    view looked for the wrong phase; such ids are refused where they are written."""
    phases = default_phases()
    phases[0]["id"] = bad_id
    repo = make_repo(tmp_path / "repo", phases, git_init=False)
    for command in ("advance", "status", "history", "report"):  # one refusal, at the plan's line
        result = cli(runner_env, repo.root, command)
        assert result.exit_code == 2, (command, result.text)
        assert "plans/demo.md:6:9: phases[0].id:" in result.stderr and "not a valid id" in result.stderr
        assert "Traceback" not in result.text
