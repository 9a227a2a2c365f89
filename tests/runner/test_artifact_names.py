"""No two files of a run share a name: with gates ``g``, ``g-x`` and ``g-a``, ``g``'s artifacts
``x.log`` and ``a-notes.md`` once landed on ``g-x``'s log and on ``g-a``'s ``notes.md``, in a
local run and in an imported one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.plan.load import load_plan
from runner.records.results import _artifact_problems
from tests.runner.repo_fixtures import cli, copy_without_git, gate, make_repo
from tests.runner.test_results import gate as result_gate

G = ('printf "artifact x.log of g" > "$RUNNER_ARTIFACTS/x.log"; '
     'printf "artifact a-notes.md of g" > "$RUNNER_ARTIFACTS/a-notes.md"')
G_X = "echo log of g-x"
G_A = 'printf "artifact notes.md of g-a" > "$RUNNER_ARTIFACTS/notes.md"'


def clashing_phases():
    return [{"id": "alpha", "title": "First", "status": "pending", "paths": ["src/"],
             "gates": [gate("g", "verify", G), gate("g-x", "verify", G_X), gate("g-a", "verify", G_A)]}]


def run_files(repo) -> tuple[Path, dict[str, str]]:
    alpha = load_plan(repo.plan).plan.phase("alpha")
    assert alpha.status == "complete"
    run_dir = (repo.root / alpha.checkpoint.report).parent
    files = {path.relative_to(run_dir).as_posix(): path.read_text()
             for path in run_dir.rglob("*") if path.is_file()}
    return run_dir, files


def assert_nothing_lost(run_dir: Path, files: dict[str, str]) -> None:
    artifacts = [text for text in files.values() if text.startswith("artifact ")]
    assert sorted(artifacts) == ["artifact a-notes.md of g", "artifact notes.md of g-a", "artifact x.log of g"]
    stored = json.loads((run_dir / "results.json").read_text())["phases"][0]["gates"]
    named = {(record["name"], name): file_name
             for record in stored for name, file_name in record["artifact_files"].items()}
    assert len(set(named.values())) == 3
    assert files[named[("g", "x.log")]] == "artifact x.log of g"
    assert files[named[("g", "a-notes.md")]] == "artifact a-notes.md of g"
    assert files[named[("g-a", "notes.md")]] == "artifact notes.md of g-a"
    report = files["report.md"]
    for file_name in named.values():
        assert f"]({file_name})" in report


def test_a_local_run_keeps_every_log_and_artifact(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", clashing_phases())
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 0, result.text
    run_dir, files = run_files(repo)
    assert files["g-x.log"].startswith("log of g-x")
    assert_nothing_lost(run_dir, files)


def test_an_imported_run_keeps_every_artifact(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo", clashing_phases())
    host = copy_without_git(repo.root, tmp_path / "host")
    made = cli(runner_env, host, "gate", "alpha", "--out", str(tmp_path / "results.json"))
    assert made.exit_code == 0, made.text
    result = cli(runner_env, repo.root, "advance", "--results", str(tmp_path / "results.json"))
    assert result.exit_code == 0, result.text
    assert_nothing_lost(*run_files(repo))


@pytest.mark.parametrize("file_name", ["../x.log", "artifacts/g/../../x", "/etc/passwd", "artifacts/g"])
def test_a_stored_artifact_file_outside_its_place_is_refused(file_name):
    record = result_gate("g").model_copy(update={"artifact_files": {"x.log": file_name}})
    assert any("artifact file" in problem for problem in _artifact_problems(record))


@pytest.mark.parametrize("imported", [False, True])
def test_artifact_names_that_differ_only_at_their_end_keep_their_own_files(tmp_path, runner_env, imported):
    """``notes.md``, ``notes.md.`` and ``notes.md-`` are three files on the gate's side: once
    cut to one name (``safe_name`` drops a last ``.`` or ``-``) the last written hid the others."""
    run = "; ".join(f'printf "artifact {name}" > "$RUNNER_ARTIFACTS/{name}"'
                    for name in ("notes.md", "notes.md.", "notes.md-"))
    phases = [{"id": "alpha", "title": "First", "status": "pending", "paths": ["src/"],
               "gates": [gate("g", "verify", run)]}]
    repo = make_repo(tmp_path / "repo", phases)
    given = []
    if imported:
        host = copy_without_git(repo.root, tmp_path / "host")
        made = cli(runner_env, host, "gate", "alpha", "--out", str(tmp_path / "results.json"))
        assert made.exit_code == 0, made.text
        given = ["--results", str(tmp_path / "results.json")]
    result = cli(runner_env, repo.root, "advance", *given)
    assert result.exit_code == 0, result.text
    run_dir, files = run_files(repo)
    stored = json.loads((run_dir / "results.json").read_text())["phases"][0]["gates"][0]["artifact_files"]
    assert len(set(stored.values())) == 3, stored
    for name, file_name in stored.items():
        assert files[file_name] == f"artifact {name}"
