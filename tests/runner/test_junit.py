"""``runner gate --junit/--summary``: JUnit XML that junitparser reads back, a Markdown step
summary, both left out of the tree fingerprint."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from junitparser import Error, Failure, JUnitXml, Skipped

from runner.records.results import ResultsFile
from runner.views.junit import junit_xml, summary_markdown, write_junit
from tests.runner.repo_fixtures import (
    cli,
    make_repo,
    snapshot,
)
from tests.runner.run_samples import REAL_RESULTS, gate_result, results


def cases_by_name(path):
    xml = JUnitXml.fromfile(str(path))
    suites = list(xml)
    return suites, {case.name: case for suite in suites for case in suite}


def test_real_kernel_run_as_junit(tmp_path):
    path = tmp_path / "junit.xml"
    write_junit(path, ResultsFile.load(REAL_RESULTS))
    [suite], cases = cases_by_name(path)
    assert suite.name == "mla-verify/kernel"
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (4, 2, 0, 0)
    assert set(cases) == {"build", "interpret", "verify", "benchmark"}
    [failure] = cases["build"].result
    assert isinstance(failure, Failure) and "spills: 176 is not == 0" in failure.message
    assert cases["verify"].is_passed
    bench = cases["benchmark"]
    tree = ET.parse(path)
    case = tree.find(".//testcase[@name='benchmark']")
    props = {prop.get("name"): prop.get("value") for prop in case.iter("property")}
    assert props["min_speedup_64k"] == "6.85" and props["expect.min_speedup_64k"] == ">= 5"
    assert "is not >= 0.80" in bench.result[0].text


def test_every_outcome_maps_to_its_junit_element(tmp_path):
    gates = [
        gate_result("ok"),
        gate_result("bad", outcome="FAIL", reason="exit code 1", log_tail="Traceback\nboom \x1b[31m"),
        gate_result("broken", outcome="ERROR", reason="could not start"),
        gate_result("gpu", outcome="BLOCKED", reason="needs cuda"),
        gate_result("later", outcome="SKIPPED", reason="an earlier gate failed"),
    ]
    path = tmp_path / "junit.xml"
    path.write_text(junit_xml(results(run_id="20261201T000000Z-00000001", created="2026-12-01T00:00:00Z", gates=gates)))
    [suite], cases = cases_by_name(path)
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (5, 1, 1, 2)
    assert cases["ok"].is_passed
    assert isinstance(cases["bad"].result[0], Failure) and "boom" in cases["bad"].result[0].text
    assert isinstance(cases["broken"].result[0], Error)
    assert cases["broken"].result[0].message == "ERROR: could not start"
    for name, reason in (("gpu", "needs cuda"), ("later", "an earlier gate failed")):
        [skipped] = cases[name].result
        assert isinstance(skipped, Skipped) and reason in skipped.message


def test_summary_of_the_real_run_shows_outcomes_and_thresholds():
    text = summary_markdown(ResultsFile.load(REAL_RESULTS))
    assert "## runner gate: mla-verify" in text and "- **kernel**: FAIL" in text
    assert "| kernel | build | build | **FAIL** | spills: 176 is not == 0 |" in text
    assert "| min_speedup_64k | 6.85 | `>= 5` | yes |" in text
    assert "| min_frac_memory_64k | 0.2538 | `>= 0.80` | **no**: 0.2538 is not >= 0.80 |" in text


def test_gate_writes_junit_and_summary_outside_the_fingerprint(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    (tmp_path / "a").mkdir()
    assert cli(runner_env, repo.root, "gate", "alpha", "--out", str(tmp_path / "a" / "plain.json")).exit_code == 0
    plain = ResultsFile.load(tmp_path / "a" / "plain.json")
    before = snapshot(repo.root)
    summary = repo.root / "summary.md"
    summary.write_text("earlier step\n")
    result = cli(runner_env, repo.root, "gate", "alpha", "--out", "results.json", "--junit", "junit.xml",
                 "--summary", "summary.md")
    assert result.exit_code == 0, result.text
    assert ResultsFile.load(repo.root / "results.json").fingerprint == plain.fingerprint
    [suite], cases = cases_by_name(repo.root / "junit.xml")
    assert suite.name == "demo/alpha" and set(cases) == {"build", "check"}
    assert all(case.is_passed for case in cases.values())
    text = summary.read_text()
    assert text.startswith("earlier step\n")  # appended, as $GITHUB_STEP_SUMMARY expects
    assert "| speedup | 2.5 | `>= 1.5` | yes |" in text
    after = snapshot(repo.root)
    assert set(after) - set(before) == {"results.json", "junit.xml", "summary.md"}


def test_junit_is_written_for_failing_and_blocked_phases(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    result = cli(runner_env, repo.root, "gate", "alpha", "beta", "--junit", str(tmp_path / "j.xml"))
    assert result.exit_code == 3, result.text
    suites, cases = cases_by_name(tmp_path / "j.xml")
    assert [suite.name for suite in suites] == ["demo/alpha", "demo/beta"]
    assert isinstance(cases["gpu"].result[0], Skipped)


def test_example_workflow_runs_the_documented_commands():
    from ruamel.yaml import YAML

    from tests.runner.run_samples import ROOT

    workflow = YAML(typ="safe").load((ROOT / "docs" / "ci" / "github-actions.yml").read_text())
    completed, gpu = workflow["jobs"]["completed"], workflow["jobs"]["gpu"]
    steps = " ".join(step.get("run", "") for step in completed["steps"])
    assert 'runner gate --completed --junit junit.xml --summary "$GITHUB_STEP_SUMMARY"' in steps
    assert "self-hosted" in gpu["runs-on"] and gpu["strategy"]["matrix"]["phase"]
    gpu_steps = " ".join(step.get("run", "") for step in gpu["steps"])
    assert "--out results-${{ matrix.phase }}.json" in gpu_steps
    assert any(step.get("uses", "").startswith("actions/upload-artifact") for step in gpu["steps"])
