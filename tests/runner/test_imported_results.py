"""Results measured elsewhere are held to what a local run is held to: bound to the plan's gate
definitions, within the artifact limits, with identity fields in the forms the runner writes.
What a hand-written file holds can neither forge a commit trailer nor reach a terminal."""

from __future__ import annotations

import json
import re

import pytest

from runner.plan.load import load_plan
from tests.runner.repo_fixtures import (
    METRICS_OK,
    cli,
    copy_without_git,
    default_phases,
    edit_results,
    gate,
    make_repo,
    write,
)


def _refused(repo, results, runner_env, *needles):
    head = repo.head()
    result = cli(runner_env, repo.root, "advance", "--results", str(results))
    assert result.exit_code == 2, result.text
    for needle in needles:
        assert needle in result.stderr, result.stderr
    assert repo.head() == head and repo.git("tag", "--list") == ""
    assert load_plan(repo.plan).plan.phase("alpha").status == "pending"
    assert not (repo.root / "reports").exists()  # refused before anything was written
    return result


def test_results_of_a_copy_whose_gate_was_edited_are_refused(tmp_path, runner_env):
    """The fingerprint leaves the plan out; the results carry the gates they ran."""
    phases = default_phases()
    phases[0]["gates"] = [gate("check", "verify", "exit 1; " + METRICS_OK, requires=["cuda"],
                               expect={"speedup": ">= 1.5"})]
    repo = make_repo(tmp_path / "repo", phases)
    host = copy_without_git(repo.root, tmp_path / "host")
    plan = host / "plans" / "demo.md"
    plan.write_text(plan.read_text().replace("exit 1; ", ""))  # the gate that always fails, defused
    runner_env.setenv("RUNNER_DEVICES", "cpu,cuda")
    assert cli(runner_env, host, "gate", "alpha", "--out", "results.json").exit_code == 0
    runner_env.setenv("RUNNER_DEVICES", "cpu")
    _refused(repo, host / "results.json", runner_env, "gate 'check': run differs", "'exit 1; printf")


def test_results_without_gate_definitions_are_refused(gpu_results, runner_env):
    repo, results = gpu_results
    edit_results(results, lambda phase: phase.pop("definitions"))
    _refused(repo, results, runner_env, "carry no gate definitions")


def test_editing_a_target_keeps_results_usable(gpu_results, runner_env):
    """Targets never decide a verdict, so they are not part of what binds results."""
    repo, results = gpu_results
    expect = '        expect: {"speedup": ">= 1.5", "errors": "== 0"}\n'
    assert expect in repo.plan.read_text()
    repo.plan.write_text(repo.plan.read_text().replace(expect, expect + '        targets: {"speedup": ">= 10"}\n'))
    repo.git("commit", "-qam", "aim higher")
    result = cli(runner_env, repo.root, "advance", "--results", str(results))
    assert result.exit_code == 0, result.text
    checkpoint = load_plan(repo.plan).plan.phase("alpha").checkpoint
    assert checkpoint.open_targets["speedup"].value == 2.5
    assert str(checkpoint.open_targets["speedup"].target) == ">= 10"


def test_more_artifacts_than_a_local_run_keeps_are_refused(gpu_results, runner_env):
    repo, results = gpu_results
    edit_results(results, lambda phase: phase["gates"][1].update(
        artifacts={f"a{i}.txt": "x" for i in range(500)}))
    _refused(repo, results, runner_env, "500 artifacts, over the limit of 20")


@pytest.mark.parametrize("artifacts, needle", [
    ({"big.txt": "x" * ((1 << 20) + 1)}, "over the 1048576-byte limit"),
    ({"../escape.md": "x"}, "is not letters, digits and ._-"),
])
def test_artifacts_a_local_run_would_skip_are_refused(gpu_results, runner_env, artifacts, needle):
    repo, results = gpu_results
    edit_results(results, lambda phase: phase["gates"][1].update(artifacts=artifacts))
    _refused(repo, results, runner_env, needle)


@pytest.mark.parametrize("field, value", [
    ("hostname", "host\nRunner-Phase: beta"),
    ("gpu_name", "GPU\rRunner-Phase: beta"),
    ("hostname", "host\x1b]52;c;ZWNobyBwd25lZA==\x07"),
])
def test_a_machine_description_with_control_characters_is_refused(gpu_results, runner_env, field, value):
    repo, results = gpu_results
    data = json.loads(results.read_text())
    data["machine"][field] = value
    results.write_text(json.dumps(data))
    result = _refused(repo, results, runner_env, f"machine.{field}", "control character")
    assert "\x1b" not in result.text and "\x07" not in result.text


@pytest.mark.parametrize("field, value, needle", [
    ("created", "yesterday", "UTC time"),
    ("created", "2026-13-45T99:00:00Z", "UTC time"),
    ("run_id", "../../escape", "run_id"),
    ("fingerprint", "sha256:not-hex", "fingerprint"),
])
def test_identity_fields_in_other_forms_are_refused(gpu_results, runner_env, field, value, needle):
    repo, results = gpu_results
    data = json.loads(results.read_text())
    data[field] = value
    results.write_text(json.dumps(data))
    _refused(repo, results, runner_env, needle)


def _planted(repo, tmp_path, runner_env, change) -> None:
    """A run folder written by hand into reports/ (not by the runner)."""
    source = make_repo(tmp_path / "source")
    assert cli(runner_env, source.root, "gate", "alpha", "--out", "planted.json").exit_code == 0
    data = json.loads((source.root / "planted.json").read_text())
    change(data)
    folder = repo.root / "reports" / "demo" / "alpha" / "20261201T000000Z-aaaaaaaa"
    write(folder, "results.json", json.dumps(data))


@pytest.mark.parametrize("change", [
    lambda data: data.update(created="yesterday"),
    lambda data: data["machine"].update(hostname="evil\x1b]52;c;ZWNobw==\x07"),
], ids=["created-yesterday", "terminal-escape"])
def test_views_skip_a_hand_written_run_and_print_no_escape(tmp_path, runner_env, change):
    repo = make_repo(tmp_path / "repo")
    _planted(repo, tmp_path, runner_env, change)
    assert cli(runner_env, repo.root, "advance").exit_code == 0  # a real run beside it
    for args in (["status"], ["status", "--json"], ["history"], ["history", "--json"], ["report"]):
        result = cli(runner_env, repo.root, *args)
        assert result.exit_code == 0, (args, result.text)
        assert "\x1b" not in result.text and "\x07" not in result.text
    assert "20261201T000000Z-aaaaaaaa" in cli(runner_env, repo.root, "history").stdout  # named as skipped
    diff = cli(runner_env, repo.root, "diff", "20261201T000000Z-aaaaaaaa", "demo/alpha")
    assert diff.exit_code == 2 and "\x1b" not in diff.text


FORGED_CHECK = {"metric": "extra|row\nx", "threshold": "<= 1 |\n| y", "value": 1, "ok": True, "reason": "a|b\nc"}


def _tables(text: str) -> list[list[str]]:
    lines = text.splitlines()
    tables: list[list[str]] = []
    for index, line in enumerate(lines):
        if line.startswith("|"):
            if index == 0 or not lines[index - 1].startswith("|"):
                tables.append([])
            tables[-1].append(line)
    return tables


def _whole(table: list[str]) -> bool:
    cells = {len(re.findall(r"(?<!\\)\|", row)) for row in table}
    return len(cells) == 1


def test_a_passing_gates_checks_are_the_runners_own_reading_of_its_metrics(gpu_results, runner_env):
    """Like its targets, a PASS gate's checks are judged here: a check the plan does not have
    never reaches the checkpointed run's report or results."""
    repo, results = gpu_results
    edit_results(results, lambda phase: phase["gates"][1]["checks"].append(dict(FORGED_CHECK)))
    result = cli(runner_env, repo.root, "advance", "--results", str(results))
    assert result.exit_code == 0, result.text
    report = repo.root / load_plan(repo.plan).plan.phase("alpha").checkpoint.report
    stored = json.loads((report.parent / "results.json").read_text())["phases"][0]["gates"][1]["checks"]
    assert [check["metric"] for check in stored] == ["speedup", "errors"]
    assert "extra" not in report.read_text()


def test_a_failed_gates_recorded_checks_keep_the_reports_tables_whole(gpu_results, runner_env):
    repo, results = gpu_results

    def fail(phase):
        phase["gates"][1].update(outcome="FAIL", reason="exit code 1", exit_code=1)
        phase["gates"][1]["checks"].append(dict(FORGED_CHECK, ok=False))
        phase.pop("outcome", None)
    edit_results(results, fail)
    result = cli(runner_env, repo.root, "advance", "--results", str(results))
    assert result.exit_code == 1, result.text
    [report] = (repo.root / "reports").rglob("report.md")
    tables = _tables(report.read_text())
    assert tables and all(_whole(table) for table in tables), tables
    assert "`<= 1 \\| \\| y`" in report.read_text()
