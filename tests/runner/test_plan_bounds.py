"""What enters the plan is bounded: a long string metric used as a headline and a target is cut
to ``MAX_PLAN_STRING`` characters in the checkpoint (metrics, open targets), the status table
and the commit message, while the run's report keeps it whole; an imported results file may
not hold more metric text than a gate's metrics file can."""

from __future__ import annotations

import json

from runner.errors import ExitCode
from runner.plan.load import load_plan
from runner.plan.schema import MAX_PLAN_STRING, plan_value
from tests.runner.repo_fixtures import PY, cli, default_phases, edit_results, gate, make_repo

LONG = "x" * 1_000_000


def long_metric_phases():
    phases = default_phases()
    write = (f"{PY} -c \"import json, os; json.dump({{'speedup': 2.5, 'errors': 0, 'blob': 'x' * 1000000}}, "
             "open(os.environ['RUNNER_METRICS'], 'w'))\"")
    phases[0]["headline"] = ["speedup", "blob"]
    phases[0]["gates"] = [gate("check", "verify", write, expect={"speedup": ">= 1.5"}, targets={"blob": ">= 1"})]
    return phases


def test_plan_value_cuts_only_long_strings():
    assert plan_value("short") == "short"
    assert plan_value(1.5) == 1.5 and plan_value(True) is True and plan_value(None) is None
    cut = plan_value("y" * (MAX_PLAN_STRING + 1))
    assert len(cut) == MAX_PLAN_STRING and cut.endswith("\u2026") and cut.startswith("y" * (MAX_PLAN_STRING - 1))
    assert plan_value("z" * MAX_PLAN_STRING) == "z" * MAX_PLAN_STRING


def test_a_megabyte_string_metric_does_not_grow_the_plan(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", long_metric_phases())
    before = repo.plan.stat().st_size
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 0, result.text
    assert repo.plan.stat().st_size - before < 4 * 1024
    alpha = load_plan(repo.plan).plan.phase("alpha")
    cut = "x" * (MAX_PLAN_STRING - 1) + "\u2026"
    assert alpha.checkpoint.metrics == {"speedup": 2.5, "blob": cut}
    assert alpha.checkpoint.open_targets["blob"].value == cut
    assert len(repo.git("log", "-1", "--format=%B")) < 4 * 1024
    assert len(cli(runner_env, repo.root, "status").stdout) < 8 * 1024
    run_dir = (repo.root / alpha.checkpoint.report).parent
    stored = json.loads((run_dir / "results.json").read_text())
    assert stored["phases"][0]["gates"][0]["metrics"]["blob"] == LONG  # the evidence keeps it whole


def test_an_import_with_more_metric_text_than_a_metrics_file_holds_is_refused(gpu_results, runner_env):
    repo, results = gpu_results
    edit_results(results, lambda phase: phase["gates"][1]["metrics"].update(blob="x" * 8_000_000))
    head = repo.head()
    result = cli(runner_env, repo.root, "advance", "--results", str(results))
    assert result.exit_code == ExitCode.USAGE, result.text
    assert "more than the 1048576-byte metrics file a gate may write" in result.stderr
    assert repo.head() == head and load_plan(repo.plan).plan.phase("alpha").status == "pending"


def test_an_import_with_a_string_metric_a_gate_could_write_is_accepted(gpu_results, runner_env):
    repo, results = gpu_results
    edit_results(results, lambda phase: phase["gates"][1]["metrics"].update(note="n" * 500_000))
    result = cli(runner_env, repo.root, "advance", "--results", str(results))
    assert result.exit_code == 0, result.text
