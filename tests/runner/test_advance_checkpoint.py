"""``runner advance`` around its checkpoint: interrupts inside it, states a killed runner left,
refusals before any gate runs, and a plan edited or deleted while the gates ran."""

from __future__ import annotations

import os
import signal

from runner.atomic import write_atomic
from runner.errors import ExitCode
from runner.plan.load import load_plan
from runner.plan.rewrite import PhaseUpdate, render_updates
from runner.plan.schema import Checkpoint
from runner.repo import checkpoint as cp
from tests.runner.repo_fixtures import (
    PY,
    cli,
    default_phases,
    gate,
    make_repo,
)


def _complete(repo) -> None:
    tag = repo.git("rev-parse", "demo/alpha^{commit}").strip()
    assert tag == repo.head()
    assert repo.git("status", "--porcelain=v1", "--", "plans", "src", "reports") == ""
    assert repo.plan.read_text() == repo.git("show", "HEAD:plans/demo.md")
    assert load_plan(repo.plan).plan.phases[0].status == "complete"


def test_sigterm_inside_the_checkpoint_completes_it(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    cp.set_fault_hook(lambda step: os.kill(os.getpid(), signal.SIGTERM) if step == "publish" else None)
    try:
        result = cli(runner_env, repo.root, "advance")
    finally:
        cp.set_fault_hook(None)
    _complete(repo)
    assert repo.git("diff", "--cached").strip() == ""  # no staged reverse diff
    assert "the plan was not changed" not in result.text


def test_a_complete_phase_without_its_checkpoint_is_refused(tmp_path, runner_env):
    """What an older runner killed between the plan rewrite and the commit left behind."""
    repo = make_repo(tmp_path / "repo")
    doc = load_plan(repo.plan)
    record = Checkpoint(tag="demo/alpha", base=repo.head(), fingerprint="sha256:0", time="2026-01-01T00:00:00Z",
                        report="reports/x/report.md", metrics={})
    write_atomic(repo.plan, render_updates(doc, {"alpha": PhaseUpdate("complete", record)}))
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == ExitCode.USAGE, result.text
    assert "never made" in result.stderr and "Traceback" not in result.text
    assert not (repo.root / "reports").exists()


def test_killed_after_publishing_is_finished_by_the_next_run(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    base = repo.head()
    old_plan = repo.plan.read_bytes()
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 0, result.text
    # as if killed right after the ref transaction: plan and index still the old ones
    repo.plan.write_bytes(old_plan)
    repo.git("reset", "-q", base, "--", "plans/demo.md")
    result = cli(runner_env, repo.root, "advance")  # repairs, then goes on to beta (blocked)
    assert "beta" in result.text, result.text
    assert repo.git("rev-parse", "demo/alpha^{commit}").strip() == repo.head()
    assert repo.git("diff", "--cached", "--", "plans").strip() == ""
    assert load_plan(repo.plan).plan.phases[0].status == "complete"


def test_existing_tag_elsewhere_is_refused_and_never_moved(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    base = repo.head()
    repo.git("tag", "demo/alpha", base)
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == ExitCode.USAGE, result.text
    assert "already exists" in result.stderr
    assert repo.head() == base and repo.git("rev-parse", "demo/alpha").strip() == base
    assert load_plan(repo.plan).plan.phases[0].status != "complete"


def test_plan_deleted_by_a_gate_is_a_clear_error(tmp_path, runner_env):
    phases = default_phases()
    phases[0]["gates"] = [gate("eraser", "build", "rm plans/demo.md")]
    repo = make_repo(tmp_path / "repo", phases)
    base = repo.head()
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code != 0
    assert "Traceback" not in result.text
    assert repo.head() == base and repo.git("tag", "-l").strip() == ""


def test_head_moved_while_the_gates_ran_is_refused(tmp_path, runner_env):
    phases = default_phases()
    commit = "git -c user.name=x -c user.email=x@x commit -q --allow-empty -m sneaky"
    phases[0]["gates"] = [gate("mover", "build", commit)]
    repo = make_repo(tmp_path / "repo", phases)
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code != 0, result.text
    assert repo.git("log", "-1", "--format=%s").strip() == "sneaky"
    assert repo.git("tag", "-l").strip() == ""


def test_plan_prose_edited_while_the_gates_ran_is_kept(tmp_path, runner_env):
    phases = default_phases()
    phases[0]["gates"] = [gate("editor", "build", f"{PY} -c \"open('plans/demo.md','a').write('human note\\\\n')\"")]
    repo = make_repo(tmp_path / "repo", phases)
    cli(runner_env, repo.root, "advance")
    assert "human note" in repo.plan.read_text()


def test_refusals_come_before_any_gate_runs(tmp_path, runner_env):
    phases = default_phases()
    phases[0]["gates"] = [gate("marker", "build", "touch ran.txt")]
    for spoil, needle in (
        (lambda repo: repo.git("config", "tag.gpgSign", "true"), "tag.gpgSign"),
        (lambda repo: (repo.root / ".git" / "index.lock").write_text(""), "index.lock"),
        (lambda repo: repo.git("tag", "demo/alpha"), "already exists"),
    ):
        repo = make_repo(tmp_path / needle.replace(".", "-"), phases)
        spoil(repo)
        result = cli(runner_env, repo.root, "advance")
        assert result.exit_code == ExitCode.USAGE, result.text
        assert needle in result.stderr and "Traceback" not in result.text
        assert not (repo.root / "ran.txt").exists() and not (repo.root / "reports").exists()


def test_phase_ids_that_are_not_tag_names_are_refused_before_any_gate(tmp_path, runner_env):
    from runner.errors import GitError
    import pytest

    repo = make_repo(tmp_path / "repo")
    for bad in ("a..b", "alpha.", "x.lock"):
        with pytest.raises(GitError, match="not a valid git tag name"):
            cp.preflight(repo.root, tag=f"demo/{bad}", expected_head=repo.head())


def test_gates_edited_in_the_plan_while_they_ran_are_refused(tmp_path, runner_env):
    phases = default_phases()
    edit = "import pathlib; p = pathlib.Path('plans/demo.md'); p.write_text(p.read_text().replace('>= 1.5', '>= 9.5'))"
    phases[0]["gates"] = [gate("editor", "build", f"{PY} -c \"{edit}\""), phases[0]["gates"][1]]
    repo = make_repo(tmp_path / "repo", phases)
    base = repo.head()
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == ExitCode.USAGE, result.text
    assert "were edited while its gates ran" in result.stderr
    assert repo.head() == base and repo.git("tag", "-l").strip() == ""
    assert ">= 9.5" in repo.plan.read_text()  # the human's edit is kept


def test_branch_switched_while_the_gates_ran_is_refused(tmp_path, runner_env):
    """HEAD names the same commit on another branch: the checkpoint must not land there."""
    phases = default_phases()
    phases[0]["gates"][0] = gate("build", "build", "git switch -q -c elsewhere")
    repo = make_repo(tmp_path / "repo", phases)
    base = repo.head()
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == ExitCode.USAGE, result.text
    assert "branch changed" in result.stderr and "Traceback" not in result.text
    assert repo.git("rev-parse", "main").strip() == base
    assert repo.git("rev-parse", "elsewhere").strip() == base
    assert repo.git("tag", "-l").strip() == ""
