"""How often a command reads the plan's YAML: each pass costs seconds on a plan of thousands
of gates, so ``advance --dry-run`` must not take several where ``status`` takes one."""

from __future__ import annotations

import pytest
from ruamel.yaml import YAML

from runner.errors import PlanError
from runner.plan.load import load_plan
from runner.plan.rewrite import check_rewritable
from tests.runner.repo_fixtures import cli, gate, make_repo


@pytest.fixture
def yaml_passes(monkeypatch):
    """The number of times any YAML text is composed or loaded, by a list's length."""
    passes: list[str] = []
    for name in ("compose", "load"):
        original = getattr(YAML, name)

        def counted(self, stream, _original=original, _name=name):
            passes.append(_name)
            return _original(self, stream)

        monkeypatch.setattr(YAML, name, counted)
    return passes


def many_phases(count: int = 30):
    return [{"id": f"p{n}", "title": f"Phase {n}", "status": "pending", "paths": ["src/"],
             "gates": [gate(f"g{g}", "verify", "true", expect={"m": ">= 1"}) for g in range(5)]}
            for n in range(count)]


def test_a_dry_run_reads_the_plan_twice_at_most(tmp_path, runner_env, yaml_passes):
    repo = make_repo(tmp_path / "repo", many_phases())
    result = cli(runner_env, repo.root, "status")
    assert result.exit_code == 0, result.text
    status_passes = len(yaml_passes)
    yaml_passes.clear()
    result = cli(runner_env, repo.root, "advance", "--dry-run")
    assert result.exit_code == 0, result.text
    assert status_passes == 1
    assert len(yaml_passes) <= 2, yaml_passes  # the load, and one check that an edit re-parses


def test_check_rewritable_composes_nothing_again(tmp_path, yaml_passes):
    repo = make_repo(tmp_path / "repo", many_phases(3), git_init=False)
    doc = load_plan(repo.plan)
    yaml_passes.clear()
    check_rewritable(doc, "p1")
    assert yaml_passes == ["compose"]  # the re-parse of the edited text, once


def test_check_rewritable_still_refuses_a_flow_style_phase(tmp_path):
    repo = make_repo(tmp_path / "repo", many_phases(2), git_init=False)
    text = repo.plan.read_text()
    start = text.index("  - id: \"p1\"")
    block = text[start:text.index("---", start)]
    flow = '  - {id: p1, status: pending, gates: [{name: g, kind: verify, run: "true"}]}\n'
    repo.plan.write_text(text.replace(block, flow))
    doc = load_plan(repo.plan)
    with pytest.raises(PlanError, match="flow style"):
        check_rewritable(doc, "p1")
