"""How much of the plan's YAML a command reads: each pass over the whole plan costs seconds on
a plan of thousands of gates, so ``advance --dry-run`` must read about what ``status`` reads
(the plan once), and its check that the phase's outcome can be written re-reads only that
phase's own lines."""

from __future__ import annotations

import pytest
from ruamel.yaml import YAML

from runner.errors import PlanError
from runner.plan.load import load_plan
from runner.plan.rewrite import check_rewritable
from tests.runner.repo_fixtures import cli, gate, make_repo


@pytest.fixture
def yaml_passes(monkeypatch):
    """Each time any YAML text is composed or loaded: ``(how, characters)``."""
    passes: list[tuple[str, int]] = []
    for name in ("compose", "load"):
        original = getattr(YAML, name)

        def counted(self, stream, _original=original, _name=name):
            passes.append((_name, len(stream) if isinstance(stream, str) else -1))
            return _original(self, stream)

        monkeypatch.setattr(YAML, name, counted)
    return passes


def read(passes) -> int:
    return sum(size for _, size in passes)


def many_phases(count: int = 30):
    return [{"id": f"p{n}", "title": f"Phase {n}", "status": "pending", "paths": ["src/"],
             "gates": [gate(f"g{g}", "verify", "true", expect={"m": ">= 1"}) for g in range(5)]}
            for n in range(count)]


def test_a_dry_run_reads_about_what_status_reads(tmp_path, runner_env, yaml_passes):
    repo = make_repo(tmp_path / "repo", many_phases())
    result = cli(runner_env, repo.root, "status")
    assert result.exit_code == 0, result.text
    assert [how for how, _ in yaml_passes] == ["compose"]
    status_read = read(yaml_passes)
    yaml_passes.clear()
    result = cli(runner_env, repo.root, "advance", "--dry-run")
    assert result.exit_code == 0, result.text
    assert read(yaml_passes) <= status_read * 1.2, yaml_passes  # the load, and phase p0's lines twice


def test_check_rewritable_reads_only_the_phases_lines_again(tmp_path, yaml_passes):
    repo = make_repo(tmp_path / "repo", many_phases(10), git_init=False)
    doc = load_plan(repo.plan)
    yaml_passes.clear()
    check_rewritable(doc, "p1")
    assert len(yaml_passes) == 2  # phase p1's lines as they are, and as the checkpoint edits them
    assert read(yaml_passes) < len(doc.front_matter) * 0.3, yaml_passes


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
