"""``runner init``: a new plan from the template, valid at once, never over an existing file."""

from __future__ import annotations

import json

from runner.plan.load import load_plan
from tests.runner.repo_fixtures import cli


def test_init_writes_a_plan_that_loads_and_status_reads(tmp_path, runner_env):
    path = tmp_path / "plans" / "0003-next.md"
    result = cli(runner_env, tmp_path, "init", str(path), "--phases", "build,verify,bench",
                 "--title", 'Next: "faster" kernels')
    assert result.exit_code == 0, result.text
    doc = load_plan(path)
    assert doc.plan.id == "0003-next" and doc.plan.title == 'Next: "faster" kernels'
    assert [phase.id for phase in doc.plan.phases] == ["build", "verify", "bench"]
    assert all(phase.status == "pending" for phase in doc.plan.phases)
    assert doc.status_section is not None
    status = cli(runner_env, tmp_path, "status", "--plan", str(path), "--json")
    assert status.exit_code == 0, status.text
    data = json.loads(status.stdout)
    assert data["next"] == "build" and [p["id"] for p in data["phases"]] == ["build", "verify", "bench"]


def test_init_placeholder_gate_fails_until_replaced(tmp_path, runner_env):
    path = tmp_path / "plan.md"
    assert cli(runner_env, tmp_path, "init", str(path), "--id", "demo").exit_code == 0
    assert load_plan(path).plan.id == "demo"
    result = cli(runner_env, tmp_path, "gate", "first", "--plan", str(path))
    assert result.exit_code == 1
    assert "first / check (verify): FAIL" in result.stderr


def test_init_never_overwrites(tmp_path, runner_env):
    path = tmp_path / "plan.md"
    path.write_text("mine\n")
    result = cli(runner_env, tmp_path, "init", str(path))
    assert result.exit_code == 2
    assert "already exists" in result.stderr and "never overwrites" in result.stderr
    assert path.read_text() == "mine\n"


def test_init_rejects_bad_ids_and_suffixes(tmp_path, runner_env):
    for args, message in (
        (["--phases", "ok,-bad"], "phase id '-bad' is not valid"),
        (["--phases", "a,a"], "repeated: a"),
        (["--id", "no spaces"], "plan id 'no spaces' is not valid"),
    ):
        result = cli(runner_env, tmp_path, "init", str(tmp_path / "p.md"), *args)
        assert result.exit_code == 2 and message in result.stderr, result.text
        assert not (tmp_path / "p.md").exists()
    result = cli(runner_env, tmp_path, "init", str(tmp_path / "p.yaml"))
    assert result.exit_code == 2 and ".md" in result.stderr
