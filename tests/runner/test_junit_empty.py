"""``runner gate --completed --junit FILE`` before any phase is complete: a valid, empty report."""

from __future__ import annotations

from junitparser import JUnitXml

from tests.runner.repo_fixtures import cli, make_repo


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
    from runner.views.junit import empty_junit_xml
    import xml.etree.ElementTree as ET

    root = ET.fromstring(empty_junit_xml('a"<b>&c').split("\n", 1)[1])
    assert root.get("name") == 'runner gate a"<b>&c' and root.get("tests") == "0"


def test_check_phases_itself_writes_the_empty_report(tmp_path):
    """The use case, not only the command line, keeps the promise (other front ends call it)."""
    from runner.check import check_phases
    from runner.workspace import open_workspace

    repo = make_repo(tmp_path / "repo")
    junit = tmp_path / "ci" / "junit.xml"
    check = check_phases(open_workspace(repo.plan), completed=True, junit=junit)
    assert check.results is None and check.exit_code == 0
    assert JUnitXml.fromfile(str(junit)).tests == 0


def test_junit_does_not_import_the_report_module():
    import ast
    from pathlib import Path

    import runner.views.junit

    tree = ast.parse(Path(runner.views.junit.__file__).read_text())
    modules = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "runner.records.run_folder" not in modules and "runner.formatting" in modules
