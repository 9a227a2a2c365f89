"""A shell gate that prints its metrics instead of writing them to ``$RUNNER_METRICS`` is told
where they go, in the reason of its failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.gates.execute import run_gate
from tests.runner.gate_helpers import make_gate
from tests.runner.repo_fixtures import cli, default_phases, gate, make_repo

SAID = "gate printed JSON on stdout; a shell gate writes its metrics to the file named by $RUNNER_METRICS"


def go(tmp_path: Path, **fields) -> object:
    root = tmp_path / "repo"
    root.mkdir(exist_ok=True)
    return run_gate(make_gate("g", "verify", **fields), repo_root=root, log_path=tmp_path / "g.log", grace_s=0.5)


def test_printed_json_names_the_metrics_file(tmp_path):
    result = go(tmp_path, run="""echo '{"x": 1}'""", expect={"x": ">= 1"})
    assert result.outcome == "FAIL"
    assert result.reason.startswith("x: not reported; ") and SAID in result.reason


def test_printed_json_among_other_output_with_repeat(tmp_path):
    result = go(tmp_path, run="""echo starting; echo '  {"x": 1, "y": [1, 2]}  '; echo done >&2""",
                expect={"x": ">= 1"}, repeat=2)
    assert result.outcome == "FAIL" and SAID in result.reason


@pytest.mark.parametrize("fields", [
    {"run": "echo hello", "expect": {"x": ">= 1"}},  # nothing that reads as JSON
    {"run": "echo '[1, 2]'", "expect": {"x": ">= 1"}},  # JSON, but not an object of metrics
    {"run": "echo '{\"x\": 1'", "expect": {"x": ">= 1"}},  # not JSON
    {"run": """echo '{"x": 1}'; printf '{"y": 2}' > "$RUNNER_METRICS" """, "expect": {"x": ">= 1"}},  # wrote some
    {"run": """printf '{"x": 0}' > "$RUNNER_METRICS"; echo '{"x": 1}'""", "expect": {"x": ">= 1"}},  # reported, too low
])
def test_no_hint_where_it_would_mislead(tmp_path, fields):
    result = go(tmp_path, **fields)
    assert result.outcome == "FAIL" and "RUNNER_METRICS" not in result.reason, result.reason


def test_a_printing_gate_that_passes_is_left_alone(tmp_path):
    result = go(tmp_path, run="""echo '{"x": 1}'""")
    assert result.outcome == "PASS" and "RUNNER_METRICS" not in result.reason


def test_the_hint_reaches_the_user_of_runner_gate(tmp_path, runner_env):
    phases = default_phases()
    phases[0]["gates"] = [gate("first", "verify", """echo '{"x": 1}'""", expect={"x": ">= 1"})]
    repo = make_repo(tmp_path / "repo", phases)
    result = cli(runner_env, repo.root, "gate", "alpha")
    assert result.exit_code == 1
    assert SAID in result.text
