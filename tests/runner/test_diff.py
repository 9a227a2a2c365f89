"""``runner diff`` and the plan's ``tolerance``: a regression needs the tolerance exceeded on
the same machine fingerprint; another machine is "not comparable"."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from runner.plan.schema import Gate
from runner.views.diff import compare_metric, diff_runs
from runner.views.history import resolve_run
from runner.workspace import open_workspace
from tests.runner.repo_fixtures import (
    METRICS_OK,
    cli,
    default_phases,
    gate,
    make_repo,
)
from tests.runner.run_samples import REAL_RESULTS, SAMPLE_ROOT, check_run, gate_result, results, sample_workspace, write_run

OLD = ("20261201T000000Z-aaaaaaaa", "2026-12-01T00:00:00Z")
NEW = ("20261202T000000Z-bbbbbbbb", "2026-12-02T00:00:00Z")


def tolerant_phases(tolerance: dict) -> list[dict]:
    phases = default_phases()
    phases[0]["gates"][1] = gate(
        "check", "verify", METRICS_OK, expect={"speedup": ">= 1.5", "errors": "== 0"}, tolerance=tolerance
    )
    return phases


@pytest.mark.parametrize(("text", "value"), [("5%", 0.05), (" 12.5 % ", 0.125), (0.1, 0.1), (2, 2.0), ("0.02", 0.02)])
def test_tolerance_reads_numbers_and_percentages(text, value):
    spec = Gate.model_validate({"name": "g", "kind": "benchmark", "run": "true", "tolerance": {"m": text}})
    assert spec.tolerance == {"m": pytest.approx(value)}


@pytest.mark.parametrize("bad", ["five", "5 %%", True, -0.1, "-1%", None, "nan"])
def test_tolerance_rejects_what_is_not_a_relative_tolerance(bad):
    with pytest.raises(ValidationError, match="tolerance"):
        Gate.model_validate({"name": "g", "kind": "benchmark", "run": "true", "tolerance": {"m": bad}})


def test_plan_with_tolerance_loads_and_status_reads_it(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", tolerant_phases({"speedup": "5%"}), git_init=False)
    ws = open_workspace(None, cwd=repo.root)
    assert ws.plan.phase("alpha").gate("check").tolerance == {"speedup": 0.05}
    assert cli(runner_env, repo.root, "status").exit_code == 0


@pytest.mark.parametrize(
    ("old", "new", "direction", "tolerance", "comparable", "verdict"),
    [
        (2.0, 1.8, "higher", 0.05, True, "regression"),       # 10% worse > 5%
        (2.0, 1.95, "higher", 0.05, True, "within tolerance"),  # 2.5% worse
        (2.0, 2.4, "higher", 0.05, True, "better"),
        (50.0, 60.0, "lower", 0.1, True, "regression"),        # 20% slower
        (50.0, 40.0, "lower", 0.1, True, "better"),
        (2.0, 1.0, "higher", None, True, "regression"),        # no tolerance: the default 10%
        (2.0, 1.9, "higher", None, True, "within tolerance"),  # 5% worse, within the default
        (2.0, 1.0, "higher", 0.05, False, "not comparable"),   # other machine
        (3, 4, None, 0.05, True, "changed"),                   # no expect: delta only
        (1.0, 1.0, "higher", 0.05, True, "unchanged"),
        (0.0, 0.5, "lower", 0.1, True, "regression"),          # from zero: infinitely worse
        ("a", "b", None, None, True, "changed"),
    ],
)
def test_verdicts(old, new, direction, tolerance, comparable, verdict):
    row = compare_metric("p", "g", "m", old, new, threshold=None, direction=direction,
                         tolerance=tolerance, comparable=comparable)
    assert row.verdict == verdict


def test_delta_and_percent():
    row = compare_metric("p", "g", "m", 2.0, 1.5, threshold=">= 1", direction="higher",
                         tolerance=None, comparable=True)
    assert row.delta == pytest.approx(-0.5) and row.delta_pct == pytest.approx(-25.0)
    zero = compare_metric("p", "g", "m", 0, 3, threshold=None, direction=None, tolerance=None, comparable=True)
    assert zero.delta == 3 and zero.delta_pct is None


def test_regression_beyond_tolerance_on_the_same_machine(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", tolerant_phases({"speedup": "5%"}), git_init=False)
    check_run(repo.root, *OLD, speedup=2.0)
    check_run(repo.root, *NEW, speedup=1.8)
    result = cli(runner_env, repo.root, "diff", OLD[0], NEW[0])
    assert result.exit_code == 1, result.text
    [row] = [line for line in result.stdout.splitlines() if " speedup " in line]
    assert row.split()[-1] == "regression"
    assert "2" in row and "1.8" in row and "-0.2" in row and "-10.0%" in row and "5%" in row
    assert "1 regression(s)" in result.stdout
    assert " errors " in result.stdout  # a metric with a threshold is always shown


def test_within_tolerance_is_no_regression(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", tolerant_phases({"speedup": 0.05}), git_init=False)
    check_run(repo.root, *OLD, speedup=2.0)
    check_run(repo.root, *NEW, speedup=1.95)
    result = cli(runner_env, repo.root, "diff", OLD[0], NEW[0], "--json")
    assert result.exit_code == 0, result.text
    data = json.loads(result.stdout)
    assert data["comparable"] and data["regressions"] == 0
    speedup = next(row for row in data["metrics"] if row["metric"] == "speedup")
    assert speedup["verdict"] == "within tolerance" and speedup["tolerance"] == 0.05
    assert speedup["delta_pct"] == pytest.approx(-2.5)


def test_another_machine_is_not_comparable(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", tolerant_phases({"speedup": "5%"}), git_init=False)
    check_run(repo.root, *OLD, speedup=2.0)
    check_run(repo.root, *NEW, speedup=1.0, gpu="Other GPU")  # far beyond the tolerance
    result = cli(runner_env, repo.root, "diff", OLD[0], NEW[0], "--json")
    assert result.exit_code == 0, result.text
    data = json.loads(result.stdout)
    assert not data["comparable"] and data["regressions"] == 0
    assert data["old"]["machine_fingerprint"] != data["new"]["machine_fingerprint"]
    speedup = next(row for row in data["metrics"] if row["metric"] == "speedup")
    assert speedup["verdict"] == "not comparable"
    text = cli(runner_env, repo.root, "diff", OLD[0], NEW[0]).stdout
    assert "not comparable" in text and "no regression" in text


def test_diff_against_a_checkpoint_tag(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", tolerant_phases({"speedup": "5%"}))
    assert cli(runner_env, repo.root, "advance").exit_code == 0  # demo/alpha, speedup 2.5
    newer = check_run(repo.root, "20991201T000000Z-cccccccc", "2099-12-01T00:00:00Z", speedup=2.0)
    result = cli(runner_env, repo.root, "diff", "demo/alpha", str(newer), "--json")
    assert result.exit_code == 1, result.text
    data = json.loads(result.stdout)
    speedup = next(row for row in data["metrics"] if row["metric"] == "speedup")
    assert (speedup["old"], speedup["new"], speedup["verdict"]) == (2.5, 2.0, "regression")


def test_runs_without_a_shared_phase_are_a_usage_error(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", git_init=False)
    check_run(repo.root, *OLD, speedup=2.0)
    other = results(run_id=NEW[0], created=NEW[1], phase="beta", gates=[gate_result("gpu")])
    write_run(repo.root, other, phase="beta")
    result = cli(runner_env, repo.root, "diff", OLD[0], NEW[0])
    assert result.exit_code == 2 and "share no phase" in result.stderr


def test_real_kernel_run_against_itself_on_the_shipped_plan():
    ws = sample_workspace()
    run = resolve_run(ws, str(REAL_RESULTS), cwd=SAMPLE_ROOT)
    result = diff_runs(ws.plan, run, run)
    assert result.comparable and not result.regressions
    assert {row.verdict for row in result.rows} == {"unchanged"}
    assert any(row.metric == "min_speedup_64k" and row.threshold == ">= 5" for row in result.rows)


# --- what is shown by default, "not run", Markdown ------------------------------------------------


def _record(run_id, gates, phase="alpha"):
    from pathlib import Path

    from runner.views.runs import RunRecord

    run = results(run_id=run_id, created="2026-12-01T10:00:00Z", gates=gates, phase=phase)
    return RunRecord(path=Path("/nonexistent") / run_id / "results.json", results=run, phase=phase)


def _gate(name, outcome, metrics):
    blocked = outcome in ("BLOCKED", "SKIPPED")
    return gate_result(name, outcome=outcome, metrics=metrics, exit_code=None if blocked else 0,
                       duration_s=0.0 if blocked else 1.5)


def test_gate_that_did_not_run_is_not_run_not_removed(tmp_path):
    from runner.plan.load import load_plan

    repo = make_repo(tmp_path / "repo", tolerant_phases({}))
    plan = load_plan(repo.plan).plan
    old = _record("20261201T100000Z-00000001", [_gate("check", "PASS", {"speedup": 2.0, "errors": 0, "t_ms": 1.0})])
    new = _record("20261201T100000Z-00000002", [_gate("check", "BLOCKED", {})])
    result = diff_runs(plan, old, new)
    assert {row.verdict for row in result.rows} == {"not run"}


def test_noise_without_threshold_is_hidden_by_default(tmp_path):
    from runner.plan.load import load_plan

    repo = make_repo(tmp_path / "repo", tolerant_phases({}))
    plan = load_plan(repo.plan).plan
    old = _record("20261201T100000Z-00000001", [_gate("check", "PASS", {"speedup": 2.0, "errors": 0, "t_ms": 100.0, "n": 5})])
    new = _record("20261201T100000Z-00000002", [_gate("check", "PASS", {"speedup": 2.0, "errors": 0, "t_ms": 100.2, "n": 9})])
    shown = {row.metric for row in diff_runs(plan, old, new).rows if row.notable}
    assert shown == {"speedup", "errors", "n"}  # thresholds always; t_ms moved 0.2%: noise


def test_markdown_format(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", tolerant_phases({"speedup": "5%"}), git_init=False)
    check_run(repo.root, *OLD, speedup=2.0)
    check_run(repo.root, *NEW, speedup=1.8)
    result = cli(runner_env, repo.root, "diff", OLD[0], NEW[0], "--format", "markdown")
    assert result.exit_code == 1
    assert "| phase | gate | metric |" in result.stdout and "**regression**" in result.stdout
    bad = cli(runner_env, repo.root, "diff", OLD[0], NEW[0], "--format", "html")
    assert bad.exit_code == 2


def test_not_run_rows_are_left_out_by_default_and_counted(tmp_path, runner_env):
    """A CPU run that only blocked against a GPU run: every metric of the blocked gates is
    "not run"; the default view names how many it left out instead of listing them."""
    phases = tolerant_phases({})
    repo = make_repo(tmp_path / "repo", phases, git_init=False)
    check_run(repo.root, *OLD, speedup=2.0)
    blocked = results(run_id=NEW[0], created=NEW[1], gates=[
        gate_result("build", "build"),
        gate_result("check", outcome="BLOCKED", reason="needs cuda", exit_code=None, duration_s=0.0)])
    write_run(repo.root, blocked)
    result = cli(runner_env, repo.root, "diff", OLD[0], NEW[0])
    assert "not run" not in [line.split()[-1] for line in result.stdout.splitlines() if line.startswith("  ")]
    assert "2 metric(s) of gates that did not run in one of the runs" in result.stdout
    assert "not run" in cli(runner_env, repo.root, "diff", OLD[0], NEW[0], "--all").stdout


def test_markdown_header_names_each_run_once(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", tolerant_phases({}), git_init=False)
    check_run(repo.root, *OLD, speedup=2.0)
    check_run(repo.root, *NEW, speedup=1.8)
    text = cli(runner_env, repo.root, "diff", OLD[0], NEW[0], "--format", "markdown").stdout
    assert f"- A: `{OLD[0]}` ({OLD[1]}, testhost: no GPU)" in text and "((" not in text


def test_worse_without_a_tolerance_is_judged_against_the_default_and_says_so(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", tolerant_phases({}), git_init=False)
    check_run(repo.root, *OLD, speedup=2.0)
    check_run(repo.root, *NEW, speedup=1.6)
    result = cli(runner_env, repo.root, "diff", OLD[0], NEW[0])
    assert result.exit_code == 1, result.text
    last = result.stdout.splitlines()[-1]
    assert last == ("1 regression(s); judged against the default tolerance of 10% (the plan declares no "
                    "tolerance: for them): check.speedup")
    [row] = [line for line in result.stdout.splitlines() if " speedup " in line]
    assert "10% (default)" in row and row.split()[-1] == "regression"


def test_samples_are_compared_by_their_median(tmp_path):
    from runner.plan.load import load_plan

    repo = make_repo(tmp_path / "repo", tolerant_phases({}))
    plan = load_plan(repo.plan).plan
    old = _record("20261201T100000Z-00000001", [_gate("check", "PASS", {"speedup": [1.0, 2.0, 3.0], "errors": 0})])
    new = _record("20261201T100000Z-00000002", [_gate("check", "PASS", {"speedup": [2.0, 3.0, 4.0, 9.0], "errors": 0})])
    [row] = [row for row in diff_runs(plan, old, new).rows if row.metric == "speedup"]
    assert (row.old, row.new, row.delta) == (2.0, 3.5, 1.5)
