"""``runner status`` says when files under a complete phase's paths changed since its checkpoint."""

from __future__ import annotations

import json

from tests.runner.repo_fixtures import cli, make_repo, write


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


def test_without_its_tag_or_outside_git_nothing_is_claimed(tmp_path, runner_env):
    repo = checkpointed(tmp_path, runner_env)
    write(repo.root, "src/code.py", "VALUE = 2\n")
    repo.git("tag", "-d", "demo/alpha")
    assert changed(runner_env, repo) is None
    assert "changed since the checkpoint" not in cli(runner_env, repo.root, "status").stdout
