"""``runner status`` says when files under a complete phase's paths changed since its checkpoint."""

from __future__ import annotations

import json

from tests.runner.repo_fixtures import cli, default_phases, make_repo, write


def checkpointed(tmp_path, runner_env):
    """A repository whose phase ``alpha`` (paths ``src/``) is complete."""
    repo = make_repo(tmp_path / "repo")
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 0, result.text
    return repo


def changed(runner_env, repo) -> list[str] | None:
    data = json.loads(cli(runner_env, repo.root, "status", "--json").stdout)
    return next(p for p in data["phases"] if p["id"] == "alpha")["checkpoint"]["changed"]


def test_a_fresh_checkpoint_has_nothing_changed(tmp_path, runner_env):
    repo = checkpointed(tmp_path, runner_env)
    assert changed(runner_env, repo) == []
    assert "changed since the checkpoint" not in cli(runner_env, repo.root, "status").stdout


def test_edits_under_the_phase_paths_are_named_committed_or_not_untracked_too(tmp_path, runner_env):
    repo = checkpointed(tmp_path, runner_env)
    write(repo.root, "src/code.py", "VALUE = 2\n")
    write(repo.root, "unrelated.txt", "unrelated v2\n")  # outside the phase's paths
    write(repo.root, "docs/notes.md", "other phase\n")
    assert changed(runner_env, repo) == ["src/code.py"]
    write(repo.root, "src/new file.py", "NEW = 1\n")
    write(repo.root, "src/__pycache__/code.pyc", "ignored\n")  # ignored by .gitignore
    assert changed(runner_env, repo) == ["src/code.py", "src/new file.py"]
    repo.git("add", "-A")
    repo.git("commit", "-q", "-m", "later work")
    assert changed(runner_env, repo) == ["src/code.py", "src/new file.py"]
    text = cli(runner_env, repo.root, "status").stdout
    assert "changed since the checkpoint: 2 files under its paths (src/code.py, src/new file.py)" in text


def test_a_deleted_file_counts_and_a_restored_one_does_not(tmp_path, runner_env):
    repo = checkpointed(tmp_path, runner_env)
    (repo.root / "src" / "code.py").unlink()
    assert changed(runner_env, repo) == ["src/code.py"]
    repo.git("checkout", "--", "src/code.py")
    assert changed(runner_env, repo) == []


def test_without_its_tag_nothing_is_claimed_and_status_says_it_cannot_tell(tmp_path, runner_env):
    repo = checkpointed(tmp_path, runner_env)
    write(repo.root, "src/code.py", "VALUE = 2\n")
    repo.git("tag", "-d", "demo/alpha")
    assert changed(runner_env, repo) is None
    text = cli(runner_env, repo.root, "status").stdout
    assert "changed since the checkpoint:" not in text
    assert "tag demo/alpha not found: what changed since the checkpoint cannot be told" in text
    data = json.loads(cli(runner_env, repo.root, "status", "--json").stdout)
    assert next(p for p in data["phases"] if p["id"] == "alpha")["checkpoint"]["tag_missing"] is True
    repo.git("tag", "demo/alpha", "HEAD")  # tagged again: the check runs again
    assert "not found" not in cli(runner_env, repo.root, "status").stdout


def test_the_runner_own_records_under_the_paths_do_not_count(tmp_path, runner_env):
    """A phase whose paths cover the whole tree: later checkpoints rewrite the plan and add
    reports, which the fingerprint leaves out; they are not the phase's code."""
    phases = default_phases()
    phases[0]["paths"] = ["."]
    repo = make_repo(tmp_path / "repo", phases)
    assert cli(runner_env, repo.root, "advance").exit_code == 0
    write(repo.root, "reports/demo/beta/later/results.json", "{}\n")
    with open(repo.plan, "a") as f:
        f.write("\nA note added later.\n")
    assert changed(runner_env, repo) == []
    write(repo.root, "unrelated.txt", "unrelated v2\n")
    assert changed(runner_env, repo) == ["unrelated.txt"]
