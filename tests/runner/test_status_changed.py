"""``runner status`` says when files under a complete phase's paths changed since its checkpoint."""

from __future__ import annotations

import json

from tests.runner.repo_fixtures import cli, default_phases, git, make_repo, write


def checkpointed(tmp_path, runner_env):
    """A repository whose phase ``alpha`` (paths ``src/``) is complete."""
    repo = make_repo(tmp_path / "repo")
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 0, result.text
    return repo


def checkpoint_json(runner_env, root) -> dict:
    data = json.loads(cli(runner_env, root, "status", "--json").stdout)
    return next(p for p in data["phases"] if p["id"] == "alpha")["checkpoint"]


def changed(runner_env, repo) -> list[str] | None:
    return checkpoint_json(runner_env, repo.root)["changed"]


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


def test_without_its_tag_the_commit_is_found_from_its_report(tmp_path, runner_env):
    """A clone that fetched no tags: the checkpoint commit is the one that added its report, a
    child of the plan's base."""
    repo = checkpointed(tmp_path, runner_env)
    tagged = repo.git("rev-parse", "demo/alpha^{commit}").strip()
    write(repo.root, "src/code.py", "VALUE = 2\n")
    repo.git("add", "-A")
    repo.git("commit", "-q", "-m", "later work")
    repo.git("tag", "-d", "demo/alpha")
    record = checkpoint_json(runner_env, repo.root)
    assert record["commit"] == tagged and record["commit_from"] == "report" and record["tag_missing"] is True
    assert record["changed"] == ["src/code.py"]
    text = cli(runner_env, repo.root, "status").stdout
    assert "changed since the checkpoint: 1 file under its paths (src/code.py)" in text
    assert f"tag demo/alpha not found: the checkpoint's commit was found from its report, {tagged[:12]}" in text
    repo.git("tag", "demo/alpha", tagged)  # tagged again: found by its tag
    record = checkpoint_json(runner_env, repo.root)
    assert record["commit_from"] == "tag" and record["tag_missing"] is False
    assert "not found" not in cli(runner_env, repo.root, "status").stdout


def test_without_its_tag_or_its_base_nothing_is_claimed(tmp_path, runner_env):
    """A base that is not the report's commit's parent (a rewritten history, a plan edited by
    hand, text that is no hash) or a shallow clone (whose one commit "adds" every file): status
    says it cannot tell, and git is never handed the plan's text as an option."""
    repo = checkpointed(tmp_path, runner_env)
    base = checkpoint_json(runner_env, repo.root)["base"]
    write(repo.root, "src/code.py", "VALUE = 2\n")
    repo.git("tag", "-d", "demo/alpha")
    plan = repo.plan.read_text()
    for bad in ("f" * 40, "--output=" + str(tmp_path / "leak"), "HEAD~1", base[:12]):
        repo.plan.write_text(plan.replace(base, bad))
        record = checkpoint_json(runner_env, repo.root)
        assert record["commit"] is None and record["changed"] is None and record["commit_from"] is None, bad
        text = cli(runner_env, repo.root, "status").stdout
        assert "changed since the checkpoint:" not in text
        assert "tag demo/alpha not found: what changed since the checkpoint cannot be told" in text
    assert not (tmp_path / "leak").exists()
    time = checkpoint_json(runner_env, repo.root)["time"]
    repo.plan.write_text(plan.replace(time, "2000-01-01T00:00:00Z"))  # not the checkpoint that commit made
    assert checkpoint_json(runner_env, repo.root)["commit"] is None
    repo.plan.write_text(plan)
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo.root}", str(shallow))
    write(shallow, "src/code.py", "VALUE = 2\n")
    record = checkpoint_json(runner_env, shallow)
    assert record["changed"] is None and record["tag_missing"] is True


def test_another_child_of_the_base_is_not_taken_for_the_checkpoint(tmp_path, runner_env):
    """A branch from the base merged later does not confuse the lookup."""
    repo = checkpointed(tmp_path, runner_env)
    record = checkpoint_json(runner_env, repo.root)
    repo.git("tag", "-d", "demo/alpha")
    repo.git("checkout", "-q", "-b", "side", record["base"])
    write(repo.root, "side.txt", "side work\n")
    repo.git("add", "-A")
    repo.git("commit", "-q", "-m", "side work")
    repo.git("checkout", "-q", "-")
    repo.git("merge", "-q", "--no-edit", "side")
    found = checkpoint_json(runner_env, repo.root)
    assert found["commit"] == record["commit"] and found["commit_from"] == "report"


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
