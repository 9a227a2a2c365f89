"""``requires: ["module:NAME"]``: a gate whose interpreter cannot find a module is BLOCKED with
the module named; one that finds it runs. The lookup uses the gate's own environment."""

from __future__ import annotations

import os

from runner.gates.requirements import find_modules, found_modules
from runner.plan.schema import Phase
from runner.records.results import ResultsFile
from tests.runner.repo_fixtures import METRICS_OK, cli, default_phases, gate, make_repo, write

MISSING = "no_such_module_for_runner_tests"


def _module_phases(*requires: str, env: dict[str, str] | None = None) -> list[dict]:
    """``alpha``: a build gate, then a verify gate needing ``requires``."""
    phases = default_phases()
    check = gate("check", "verify", METRICS_OK, expect={"speedup": ">= 1.5", "errors": "== 0"},
                 requires=list(requires))
    if env:
        check["env"] = env
    phases[0]["gates"] = [gate("build", "build", "echo building"), check]
    return phases


def test_a_missing_module_blocks_the_gate_with_the_module_named(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", _module_phases(f"module:{MISSING}"))
    out = tmp_path / "results.json"
    result = cli(runner_env, repo.root, "gate", "alpha", "--out", str(out))
    assert result.exit_code == 3, result.text
    [phase] = ResultsFile.load(out).phases
    outcomes = {g.name: (g.outcome, g.reason) for g in phase.gates}
    assert outcomes["build"][0] == "PASS"
    assert outcomes["check"][0] == "BLOCKED" and f"module {MISSING}" in outcomes["check"][1]
    assert f"the Python module {MISSING}" in result.stderr  # how to finish it elsewhere


def test_a_present_module_lets_the_gate_run(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", _module_phases("module:peer_lib", "module:json"))
    write(repo.root, "peer_lib.py", "VALUE = 1\n")  # found from the repository root, as the gate imports it
    repo.git("add", "-A")
    repo.git("commit", "-q", "-m", "peer_lib")
    out = tmp_path / "results.json"
    result = cli(runner_env, repo.root, "gate", "alpha", "--out", str(out))
    assert result.exit_code == 0, result.text
    [phase] = ResultsFile.load(out).phases
    assert [(g.name, g.outcome) for g in phase.gates] == [("build", "PASS"), ("check", "PASS")]


def test_the_dry_run_says_which_module_is_missing(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", _module_phases("module:json", f"module:{MISSING}"))
    result = cli(runner_env, repo.root, "advance", "--dry-run")
    assert result.exit_code == 0, result.text
    line = next(line for line in result.stdout.splitlines() if "check:" in line)
    assert "blocked" in line and MISSING in line and "json" not in line


def test_the_lookup_uses_the_gate_environment(tmp_path):
    """A module on the PYTHONPATH of the gate's ``env:`` is found for that gate only; nothing of it runs."""
    extra = tmp_path / "site"
    write(extra, "carried_peer.py", "raise SystemExit('imported')\n")
    repo = make_repo(tmp_path / "repo", git_init=False)
    phase = Phase.model_validate({"id": "p", "gates": [
        gate("with", "verify", requires=["module:carried_peer"], env={"PYTHONPATH": str(extra)}),
        gate("without", "verify", requires=["module:carried_peer"]),
        gate("plain", "verify"),
    ]})
    assert found_modules(phase, repo.root) == {"with": frozenset({"carried_peer"}), "without": frozenset()}


def test_a_lookup_that_cannot_answer_finds_nothing(tmp_path):
    env = dict(os.environ)
    assert find_modules(["json", MISSING, "os.path", "json.no_such_part"], env, tmp_path) == {"json", "os.path"}
    assert find_modules([], env, tmp_path) == frozenset()
    broken = {**env, "PYTHONHOME": str(tmp_path / "no-python-home")}  # the child cannot start
    assert find_modules(["json"], broken, tmp_path) == frozenset()
    assert find_modules(["json"], env, tmp_path, timeout_s=1e-6) == frozenset()
