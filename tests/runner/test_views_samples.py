"""A metric reported as samples reads as its median and the interval of the median in every
view: status, history, report.md, JUnit and the step summary, and the HTML page's plots."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from runner.plan.samples import median_interval
from runner.views.html import render_html_report
from runner.workspace import open_workspace
from tests.runner.repo_fixtures import cli, default_phases, gate, make_repo
from tests.runner.run_samples import gate_result, results, write_run

SAMPLES = [2.0 + 0.01 * i for i in range(20)]  # median 2.095, 95% interval [2.05, 2.14]
TEXT = "speedup=2.095 (median of 20; 95% interval [2.05, 2.14])"

# a gate that reports those samples itself
SAMPLED_GATE = ("python3 -c 'import json, os; json.dump({\"speedup\": [2.0 + 0.01 * i for i in range(20)], "
                "\"errors\": 0}, open(os.environ[\"RUNNER_METRICS\"], \"w\"))'")


def sampled_phases(confidence: float | None = None) -> list[dict]:
    phases = default_phases()
    extra = {"confidence": confidence} if confidence is not None else {}
    phases[0]["gates"][1] = gate("check", "benchmark", SAMPLED_GATE, expect={"speedup": ">= 1.5", "errors": "== 0"},
                                 **extra)
    return phases


def test_the_interval_is_the_one_the_gate_judged():
    interval = median_interval(SAMPLES, 0.95)
    assert (round(interval.low, 4), round(interval.high, 4)) == (2.05, 2.14)


def test_status_and_history_of_a_run_show_the_median_and_its_interval(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", sampled_phases(), git_init=False)
    run = results(run_id="20261201T000000Z-aaaaaaaa", created="2026-12-01T00:00:00Z", gates=[
        gate_result("build", "build"), gate_result("check", "benchmark", "FAIL", metrics={"speedup": SAMPLES})])
    write_run(repo.root, run)
    assert TEXT in cli(runner_env, repo.root, "history", "alpha").stdout
    assert TEXT in cli(runner_env, repo.root, "status").stdout


def test_status_of_a_checkpoint_shows_the_interval_of_its_run(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", sampled_phases())
    advanced = cli(runner_env, repo.root, "advance")
    assert advanced.exit_code == 0, advanced.text
    status = cli(runner_env, repo.root, "status").stdout
    assert TEXT in status
    assert "speedup=2.095, errors=0" in (repo.root / "plans/demo.md").read_text()  # the plan keeps the median
    report = next((repo.root / "reports/demo/alpha").glob("*/report.md")).read_text()
    assert "| speedup | 2.095 (median of 20; 95% interval [2.05, 2.14]) |" in report  # headline table


def test_a_gates_confidence_is_the_level_shown(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", sampled_phases(confidence=0.8))
    run = results(run_id="20261201T000000Z-aaaaaaaa", created="2026-12-01T00:00:00Z", gates=[
        gate_result("build", "build"), gate_result("check", "benchmark", metrics={"speedup": SAMPLES})])
    write_run(repo.root, run)
    assert "speedup=2.095 (median of 20; 80% interval [" in cli(runner_env, repo.root, "history").stdout


def test_junit_and_summary_show_the_interval(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", sampled_phases())
    junit, summary = tmp_path / "junit.xml", tmp_path / "summary.md"
    result = cli(runner_env, repo.root, "gate", "alpha", "--junit", str(junit), "--summary", str(summary))
    assert result.exit_code == 0, result.text
    properties = {p.get("name"): p.get("value") for p in ET.parse(junit).iter("property")}
    assert properties["speedup"] == "2.095 (median of 20; 95% interval [2.05, 2.14])"
    assert "| speedup | 2.095 (median of 20; 95% interval [2.05, 2.14]) |" in summary.read_text()


def test_the_html_history_plot_draws_the_interval(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", sampled_phases(), git_init=False)
    for day, samples in ((1, SAMPLES), (2, [value + 0.5 for value in SAMPLES])):
        gates = [gate_result("build", "build"), gate_result("check", "benchmark", metrics={"speedup": samples})]
        write_run(repo.root, results(run_id=f"2026120{day}T000000Z-aaaaaaaa",
                                     created=f"2026-12-0{day}T00:00:00Z", gates=gates))
    html = render_html_report(open_workspace(None, cwd=repo.root), repo.root / "x.html")
    [plot] = re.findall(r"<figcaption>speedup across 2 run\(s\)</figcaption>(<svg.*?</svg>)", html, re.DOTALL)
    assert "interval of the median" in plot
    assert "2.595 (median of 20; 95% interval [2.55, 2.64])" in html  # the timeline's headline


def test_a_single_number_has_no_interval_drawn(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", git_init=False)
    gates = [gate_result("build", "build"), gate_result("check", metrics={"speedup": 2.0, "errors": 0})]
    write_run(repo.root, results(run_id="20261201T000000Z-aaaaaaaa", created="2026-12-01T00:00:00Z", gates=gates))
    html = render_html_report(open_workspace(None, cwd=repo.root), repo.root / "x.html")
    assert "speedup across 1 run(s)" in html and "interval of the median" not in html
