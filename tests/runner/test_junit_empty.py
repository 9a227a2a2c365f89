"""``runner gate --completed --junit FILE`` before any phase is complete: a valid, empty report."""

from __future__ import annotations

from junitparser import JUnitXml

from tests.runner.repo_fixtures import cli, make_repo, runner_env  # noqa: F401 - fixture


def test_completed_with_no_complete_phase_writes_an_empty_junit_report(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    junit = tmp_path / "ci" / "junit.xml"
    result = cli(runner_env, repo.root, "gate", "--completed", "--junit", str(junit))
    assert result.exit_code == 0, result.text
    xml = JUnitXml.fromfile(str(junit))
    assert xml.tests == 0 and xml.failures == 0 and xml.errors == 0
    assert list(xml) == []
    assert repo.porcelain() == ""


def test_empty_junit_xml_escapes_the_plan_id():
    from runner.junit import empty_junit_xml
    import xml.etree.ElementTree as ET

    root = ET.fromstring(empty_junit_xml('a"<b>&c').split("\n", 1)[1])
    assert root.get("name") == 'runner gate a"<b>&c' and root.get("tests") == "0"
