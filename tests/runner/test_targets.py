"""``targets:`` beside ``expect:``: what the team aims at. A missed target never changes a
verdict, a status, an exit code or a checkpoint; it is shown with its gap wherever thresholds
are, and a checkpoint records the targets it left open."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from runner.plan.load import load_plan
from tests.runner.repo_fixtures import METRICS_OK, cli, default_phases, gate, make_repo
from tests.runner.run_samples import check_run


def aiming_phases(targets=None):
    """alpha's check passes its thresholds (speedup 2.5 >= 1.5, errors 0) and aims higher."""
    phases = default_phases()
    phases[0]["gates"] = [gate("check", "verify", METRICS_OK, expect={"speedup": ">= 1.5", "errors": "== 0"},
                               targets=targets if targets is not None else {"speedup": ">= 10", "errors": "== 0"})]
    return phases


def test_a_missed_target_changes_no_verdict_status_exit_code_or_checkpoint(tmp_path, runner_env):
    outcomes = []
    for name, targets in (("with", None), ("without", {})):
        repo = make_repo(tmp_path / name, aiming_phases(targets))
        result = cli(runner_env, repo.root, "advance")
        alpha = load_plan(repo.plan).plan.phase("alpha")
        outcomes.append((result.exit_code, alpha.status, alpha.checkpoint.metrics, repo.commit_count(),
                         repo.git("tag", "--list").strip()))
        if targets is None:
            assert {name: (str(t.target), t.value) for name, t in alpha.checkpoint.open_targets.items()} == {
                "speedup": (">= 10", 2.5)}
            assert "open_targets:" in repo.plan.read_text()
            assert "targets left open: speedup" in result.stdout
        else:
            assert alpha.checkpoint.open_targets == {} and "open_targets" not in repo.plan.read_text()
    assert outcomes[0] == outcomes[1] == (0, "complete", {"speedup": 2.5, "errors": 0}, 2, "demo/alpha")


def test_targets_take_the_threshold_syntax(tmp_path, runner_env):
    phases = aiming_phases({"speedup": "at least 10"})
    repo = make_repo(tmp_path / "repo", phases, git_init=False)
    result = cli(runner_env, repo.root, "status")
    assert result.exit_code == 2 and "targets.speedup" in result.stderr and "cannot read threshold" in result.stderr


@pytest.fixture
def checkpointed(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", aiming_phases())
    assert cli(runner_env, repo.root, "advance").exit_code == 0
    return repo


def test_status_shows_the_open_targets_with_their_gap(checkpointed, runner_env):
    text = cli(runner_env, checkpointed.root, "status").stdout
    assert "targets the checkpoint left open: speedup 2.5 (>= 10, 7.5 short)" in text
    data = json.loads(cli(runner_env, checkpointed.root, "status", "--json").stdout)
    [speedup] = data["phases"][0]["targets"]
    assert (speedup["metric"], speedup["threshold"], speedup["value"], speedup["gap"], speedup["ok"]) == (
        "speedup", ">= 10", 2.5, 7.5, False)
    assert data["phases"][0]["checkpoint"]["open_targets"] == {"speedup": {"target": ">= 10", "value": 2.5}}


def test_a_pending_phase_shows_its_targets_against_its_last_run(tmp_path, runner_env):
    phases = aiming_phases()
    phases[0]["gates"][0]["expect"]["speedup"] = ">= 3"  # the gate fails its threshold
    repo = make_repo(tmp_path / "repo", phases)
    assert cli(runner_env, repo.root, "advance").exit_code == 1
    text = cli(runner_env, repo.root, "status").stdout
    assert "targets: 1 of 2 met; open: speedup 2.5 (>= 10, 7.5 short)" in text


def test_history_and_the_reports_show_targets(checkpointed, runner_env):
    history = cli(runner_env, checkpointed.root, "history").stdout
    assert "1 of 2 met; open: speedup 2.5 (>= 10, 7.5 short)" in history
    runs = json.loads(cli(runner_env, checkpointed.root, "history", "--json").stdout)["runs"]
    assert [(t["metric"], t["ok"]) for t in runs[0]["targets"]] == [("speedup", False), ("errors", True)]
    [report] = (checkpointed.root / "reports").rglob("report.md")
    markdown = report.read_text()
    assert "## Targets" in markdown and "| speedup | `>= 10` | 2.5 | 7.5 short |" in markdown
    assert cli(runner_env, checkpointed.root, "report").exit_code == 0
    html = (checkpointed.root / "reports" / "index.html").read_text()
    assert "targets (never fail a gate): 1 of 2 met" in html and "7.5 short" in html


def test_junit_and_the_ci_summary_carry_targets_as_information(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", aiming_phases())
    junit, summary = tmp_path / "junit.xml", tmp_path / "summary.md"
    result = cli(runner_env, repo.root, "gate", "alpha", "--junit", str(junit), "--summary", str(summary))
    assert result.exit_code == 0, result.text
    case = ET.parse(junit).find(".//testcase[@name='check']")
    properties = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert properties["target.speedup"] == ">= 10" and properties["target_gap.speedup"] == "7.5 short"
    assert properties["target_gap.errors"] == "met"
    assert case.find("failure") is None
    assert "target `>= 10` | 7.5 short (a target: the gate does not fail)" in summary.read_text()


def test_diff_shows_where_the_new_run_stands_against_each_target(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", aiming_phases())
    check_run(repo.root, "20261201T000000Z-aaaaaaaa", "2026-12-01T00:00:00Z", 2.0)
    check_run(repo.root, "20261202T000000Z-bbbbbbbb", "2026-12-02T00:00:00Z", 12.0)
    result = cli(runner_env, repo.root, "diff", "20261201T000000Z-aaaaaaaa", "20261202T000000Z-bbbbbbbb")
    assert result.exit_code == 0, result.text
    [row] = [line for line in result.stdout.splitlines() if " speedup " in line]
    assert ">= 10 met" in row and "better" in row
    data = json.loads(cli(runner_env, repo.root, "diff", "20261201T000000Z-aaaaaaaa",
                          "20261202T000000Z-bbbbbbbb", "--json").stdout)
    [speedup] = [row for row in data["metrics"] if row["metric"] == "speedup"]
    assert (speedup["target"], speedup["target_met"], speedup["target_gap"]) == (">= 10", True, 0.0)


def test_a_target_alone_says_which_way_is_better(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", aiming_phases())
    plan = repo.plan.read_text().replace('"speedup": ">= 1.5", ', "")  # speedup: a target, no threshold
    repo.plan.write_text(plan)
    check_run(repo.root, "20261201T000000Z-aaaaaaaa", "2026-12-01T00:00:00Z", 2.0)
    check_run(repo.root, "20261202T000000Z-bbbbbbbb", "2026-12-02T00:00:00Z", 1.0)
    result = cli(runner_env, repo.root, "diff", "20261201T000000Z-aaaaaaaa", "20261202T000000Z-bbbbbbbb")
    [row] = [line for line in result.stdout.splitlines() if " speedup " in line]
    assert row.split()[-1] == "regression" and ">= 10, 9 short" in row  # 50% worse: beyond the default 10%


def sampled_target_repo(root):
    """alpha reports seven speedup samples: median 10.5 meets its target ">= 10", while the 95%
    interval of the median, [min, max] = [6, 12], does not."""
    samples = [6.0, 9.5, 10.2, 10.5, 11.0, 11.5, 12.0]
    phases = default_phases()
    phases[0]["gates"] = [gate("check", "verify", f"""printf '{{"speedup": {samples}, "errors": 0}}' > "$RUNNER_METRICS" """,
                               expect={"speedup": ">= 1.5", "errors": "== 0"}, targets={"speedup": ">= 10"})]
    return make_repo(root, phases)


def test_a_sampled_target_whose_median_meets_it_stays_open_on_its_interval(tmp_path, runner_env):
    repo = sampled_target_repo(tmp_path / "repo")
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 0, result.text
    assert "targets left open: speedup" in result.stdout
    [open_target] = load_plan(repo.plan).plan.phase("alpha").checkpoint.open_targets.values()
    assert (open_target.value, open_target.low, open_target.high, open_target.samples) == (10.5, 6.0, 12.0, 7)
    text = cli(runner_env, repo.root, "status").stdout
    assert "targets the checkpoint left open: speedup 10.5 (>= 10, 4 short)" in text
    data = json.loads(cli(runner_env, repo.root, "status", "--json").stdout)
    [speedup] = data["phases"][0]["targets"]
    assert (speedup["ok"], speedup["gap"], speedup["interval"], speedup["samples"]) == (False, 4.0, [6.0, 12.0], 7)
    for results in (repo.root / "reports").rglob("results.json"):
        results.unlink()  # the plan's record alone: the interval it keeps
    assert "targets the checkpoint left open: speedup 10.5 (>= 10, 4 short)" in cli(runner_env, repo.root, "status").stdout


def test_an_open_target_with_half_an_interval_is_a_plan_error(checkpointed, runner_env):
    plan = checkpointed.plan.read_text()
    assert "value: 2.5\n" in plan
    checkpointed.plan.write_text(plan.replace("value: 2.5\n", "value: 2.5\n          low: 1.0\n", 1))
    result = cli(runner_env, checkpointed.root, "status")
    assert result.exit_code == 2 and "'low', 'high', 'samples' and 'confidence' together" in result.stderr


def test_an_open_target_recorded_with_its_median_alone_stays_open(tmp_path, runner_env):
    # A record without the interval: the checkpoint's run says how short; without the run, "not met".
    repo = sampled_target_repo(tmp_path / "repo")
    assert cli(runner_env, repo.root, "advance").exit_code == 0
    plan = repo.plan.read_text()
    legacy = "".join(line for line in plan.splitlines(keepends=True)
                     if line.strip().split(":")[0] not in ("low", "high", "samples", "confidence"))
    assert legacy != plan
    repo.plan.write_text(legacy)
    assert "speedup 10.5 (>= 10, 4 short)" in cli(runner_env, repo.root, "status").stdout
    for results in (repo.root / "reports").rglob("results.json"):
        results.unlink()
    assert "speedup 10.5 (>= 10, not met)" in cli(runner_env, repo.root, "status").stdout
