"""``CheckpointRepo.is_tracked``: the index's view of a path, literal pathspecs."""

from __future__ import annotations

from runner.gitops import CheckpointRepo
from tests.runner.repo_fixtures import make_repo


def test_is_tracked_is_literal_and_sees_deleted_files(tmp_path, runner_env):
    repo = make_repo(tmp_path / "repo")
    checkpoints = CheckpointRepo(repo.root)
    assert checkpoints.is_tracked("src/code.py") and checkpoints.is_tracked("src")
    (repo.root / "src" / "code.py").unlink()
    assert checkpoints.is_tracked("src/code.py")  # deleted but still in the index
    assert not checkpoints.is_tracked("src/*.py") and not checkpoints.is_tracked("nothing-here")
