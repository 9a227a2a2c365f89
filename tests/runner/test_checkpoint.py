"""The checkpoint is all or nothing: refusals first, then a sequence that interrupts and kills
at any point leave either the state before it or a complete checkpoint (after ``recover``)."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from runner.errors import GitError
from runner.gates.procgroup import group_members
from runner.repo import checkpoint as cp
from runner.repo.fingerprint import tree_state
from tests.runner.repo_fixtures import git as _git, write

PLAN = "plans/p.md"
BEFORE = b"---\nid: demo\n---\nprose\nstatus: pending\n"
TAG = "demo/alpha"


def git(root: Path, *args: str, check: bool = True) -> str:
    return _git(root, *args, check=check).strip()


@pytest.fixture(autouse=True)
def isolated_git(runner_env):
    yield
    cp.set_fault_hook(None)


def new_repo(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.name", "Test Person")
    git(root, "config", "user.email", "test@example.com")
    (root / "plans").mkdir()
    (root / PLAN).write_bytes(BEFORE)
    write(root, "src/a.py", "a = 1\n")
    write(root, "staged.txt", "v1\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    write(root, "src/a.py", "a = 2\n")  # the phase's change, committed with the checkpoint
    write(root, "reports/run1/report.md", "# report\n")
    write(root, "staged.txt", "v2\n")
    git(root, "add", "staged.txt")  # the user's unrelated staged change
    return root


def render(data: bytes) -> str:
    return data.decode().replace("status: pending", "status: complete")


MESSAGE = cp.commit_message("demo", "alpha", "sha256:f", "m1", "no GPU", "host", [("build", "PASS")], {})


def files_as_tested(root: Path) -> dict[str, str]:
    """The tree as the gates saw it: now (the plan and reports/ left out, as the runner does)."""
    return dict(tree_state(root, exclude=[PLAN, "reports"]).files)


def run_checkpoint(root: Path, head: str, **overrides) -> str:
    kwargs = dict(
        plan_rel=PLAN, plan_before=BEFORE, plan_text=render, paths=["src"], evidence=["reports/run1"],
        tested=files_as_tested(root), message=MESSAGE, tag=TAG, tag_message="demo/alpha: checkpoint",
        expected_head=head, expected_branch="refs/heads/main",
    )
    kwargs.update(overrides)
    return cp.make_checkpoint(root, **kwargs)


def state(root: Path) -> dict[str, str]:
    return {
        "head": git(root, "rev-parse", "HEAD"),
        "refs": git(root, "for-each-ref"),
        "status": git(root, "status", "--porcelain=v1", "-uall"),
        "index": git(root, "ls-files", "-s"),
        "plan": (root / PLAN).read_text() if (root / PLAN).exists() else "<gone>",
    }


def assert_complete(root: Path, base: str) -> None:
    head = git(root, "rev-parse", "HEAD")
    assert git(root, "rev-parse", "HEAD^") == base
    assert git(root, "rev-parse", f"{TAG}^{{commit}}") == head
    assert git(root, "cat-file", "-t", TAG) == "tag"
    assert (root / PLAN).read_bytes() == git(root, "show", f"HEAD:{PLAN}").encode() + b"\n"
    assert b"status: complete" in (root / PLAN).read_bytes()
    for path in (PLAN, "src/a.py", "reports/run1/report.md"):
        assert git(root, "status", "--porcelain=v1", "--", path) == "", path
    assert git(root, "diff", "--cached", "--name-only") == "staged.txt"  # still staged, not committed
    assert git(root, "show", "HEAD:staged.txt") == "v1"


def assert_before(root: Path, before: dict[str, str]) -> None:
    assert state(root) == before


def test_checkpoint_commits_tags_and_writes_the_plan_last(tmp_path):
    root = new_repo(tmp_path / "r")
    base = git(root, "rev-parse", "HEAD")
    sha = run_checkpoint(root, base)
    assert sha == git(root, "rev-parse", "HEAD")
    assert_complete(root, base)
    assert sorted(git(root, "diff-tree", "-r", "--name-only", base, sha).split()) == [
        PLAN, "reports/run1/report.md", "src/a.py"]


@pytest.mark.parametrize("setup, expected", [
    (lambda root: git(root, "config", "tag.gpgSign", "true"), "tag.gpgSign"),
    (lambda root: write(root, ".git/index.lock", ""), "index.lock"),
    (lambda root: git(root, "tag", TAG, "HEAD"), "already exists"),
    (lambda root: (write(root, "x", "x"), git(root, "add", "x"), git(root, "commit", "-qm", "moved")),
     "HEAD moved"),
    (lambda root: git(root, "switch", "-q", "-c", "other"), "branch changed"),
    (lambda root: (root / PLAN).unlink(), "deleted"),
])
def test_refusals_change_nothing(tmp_path, setup, expected):
    root = new_repo(tmp_path / "r")
    base = git(root, "rev-parse", "HEAD")
    setup(root)
    before = state(root)
    objects_before = git(root, "count-objects")
    with pytest.raises(GitError, match=expected):
        run_checkpoint(root, base)
    assert state(root) == before
    assert git(root, "count-objects") == objects_before  # refused before anything was written


@pytest.mark.parametrize("phase_id", ["a..b", "alpha.", "x.lock", "a b", "a~1", "a:b", "-x/..", "a\nb"])
def test_invalid_tag_names_are_refused(tmp_path, phase_id):
    root = new_repo(tmp_path / "r")
    base = git(root, "rev-parse", "HEAD")
    before = state(root)
    with pytest.raises(GitError, match="not a valid git tag name"):
        run_checkpoint(root, base, tag=f"demo/{phase_id}")
    assert state(root) == before


def test_plan_edited_while_gates_ran_is_merged_not_overwritten(tmp_path):
    root = new_repo(tmp_path / "r")
    base = git(root, "rev-parse", "HEAD")
    (root / PLAN).write_bytes(BEFORE + b"a human's new paragraph\n")
    run_checkpoint(root, base)
    assert (root / PLAN).read_bytes() == BEFORE.replace(b"pending", b"complete") + b"a human's new paragraph\n"
    assert_complete(root, base)


def test_plan_edit_that_cannot_be_merged_is_refused(tmp_path):
    root = new_repo(tmp_path / "r")
    base = git(root, "rev-parse", "HEAD")
    (root / PLAN).write_bytes(b"rewritten by hand\n")
    before = state(root)

    def strict(data: bytes) -> str:
        if data != BEFORE:
            raise ValueError("the status section is gone")
        return render(data)

    with pytest.raises(GitError, match="edited while the gates ran"):
        run_checkpoint(root, base, plan_text=strict)
    assert state(root) == before


def test_branch_moved_during_build_is_a_compare_and_swap_refusal(tmp_path):
    root = new_repo(tmp_path / "r")
    base = git(root, "rev-parse", "HEAD")

    def move_branch(step: str) -> None:
        if step == "publish":
            write(root, "y", "y")
            git(root, "add", "y")
            git(root, "commit", "-qm", "racing commit")

    cp.set_fault_hook(move_branch)
    with pytest.raises(GitError, match="nothing was changed"):
        run_checkpoint(root, base)
    assert git(root, "log", "-1", "--format=%s") == "racing commit"
    assert git(root, "tag", "-l") == ""
    assert (root / PLAN).read_bytes() == BEFORE


def test_index_lock_taken_after_publishing_is_a_note_not_a_failure(tmp_path):
    root = new_repo(tmp_path / "r")
    base = git(root, "rev-parse", "HEAD")
    cp.set_fault_hook(lambda step: write(root, ".git/index.lock", "") if step == "index" else None)
    notes: list[str] = []
    sha = run_checkpoint(root, base, notes=notes)
    assert sha == git(root, "rev-parse", "HEAD") == git(root, "rev-parse", f"{TAG}^{{commit}}")
    assert (root / PLAN).read_bytes() == git(root, "show", f"HEAD:{PLAN}").encode() + b"\n"
    assert len(notes) == 1 and "index" in notes[0]
    (root / ".git" / "index.lock").unlink()
    assert cp.recover(root, plan_rel=PLAN).problems == []
    assert_complete(root, base)


def test_plan_that_is_a_symbolic_link_commits_its_target(tmp_path):
    root = new_repo(tmp_path / "r")
    (root / "plans" / "real.md").write_bytes(BEFORE)
    (root / PLAN).unlink()
    (root / PLAN).symlink_to("real.md")
    git(root, "add", "-A", "plans")
    git(root, "commit", "-qm", "plan is a link")
    base = git(root, "rev-parse", "HEAD")
    run_checkpoint(root, base, paths=[], evidence=[])
    assert (root / PLAN).is_symlink()
    assert git(root, "show", "HEAD:plans/real.md").startswith("---") and "complete" in git(root, "show", "HEAD:plans/real.md")
    assert git(root, "ls-tree", "HEAD", PLAN).split()[0] == "120000"
    assert git(root, "status", "--porcelain=v1", "--", "plans") == ""


def test_plan_linked_outside_the_repository_is_refused(tmp_path):
    root = new_repo(tmp_path / "r")
    outside = tmp_path / "elsewhere.md"
    outside.write_bytes(BEFORE)
    (root / PLAN).unlink()
    (root / PLAN).symlink_to(outside)
    base = git(root, "rev-parse", "HEAD")
    with pytest.raises(GitError, match="outside the repository"):
        run_checkpoint(root, base)
    assert outside.read_bytes() == BEFORE


# --- interrupts -----------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("step", [s for s in cp.STEPS if s != "preflight"])
def test_interrupt_inside_the_checkpoint_takes_effect_after_it(tmp_path, signum, step):
    root = new_repo(tmp_path / "r")
    base = git(root, "rev-parse", "HEAD")

    def raise_interrupt(_signum, _frame):
        raise KeyboardInterrupt

    cp.set_fault_hook(lambda name: os.kill(os.getpid(), signum) if name == step else None)
    old = signal.signal(signum, raise_interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_checkpoint(root, base)
    finally:
        signal.signal(signum, old)
    assert_complete(root, base)


def test_interrupt_at_preflight_leaves_everything(tmp_path):
    root = new_repo(tmp_path / "r")
    base = git(root, "rev-parse", "HEAD")
    before = state(root)

    def hook(name: str) -> None:
        if name == "preflight":
            raise KeyboardInterrupt

    cp.set_fault_hook(hook)
    with pytest.raises(KeyboardInterrupt):
        run_checkpoint(root, base)
    assert_before(root, before)


# --- kills ----------------------------------------------------------------------------------


def _fork_checkpoint(root: Path, base: str, kill_at: str | None) -> int:
    """A child in its own process group running the checkpoint; it SIGKILLs itself at ``kill_at``."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.setpgid(0, 0)
            os.close(read_fd)
            if kill_at is not None:
                cp.set_fault_hook(lambda name: os.kill(os.getpid(), signal.SIGKILL) if name == kill_at else None)
            os.write(write_fd, b"r")
            os.close(write_fd)
            run_checkpoint(root, base)
        finally:
            os._exit(0)
    os.close(write_fd)
    os.read(read_fd, 1)  # the child is running
    os.close(read_fd)
    return pid


def _reap(pid: int) -> None:
    os.waitpid(pid, 0)
    # git processes the killed child started keep running to their end; wait for them.
    deadline = time.monotonic() + 30
    while group_members(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not group_members(pid)


def _check_after_kill(root: Path, base: str, before: dict[str, str]) -> str:
    heads = git(root, "rev-parse", "HEAD")
    tag = git(root, "tag", "-l", TAG)
    # branch and tag move together: never one without the other
    assert (heads == base) == (tag == ""), (heads, tag)
    found = cp.recover(root, plan_rel=PLAN)
    assert found.problems == []
    assert list(root.joinpath(".git").glob("runner-index-*")) == []
    if git(root, "rev-parse", "HEAD") == base:
        assert_before(root, before)
        return "before"
    assert_complete(root, base)
    return "complete"


@pytest.mark.parametrize("step", cp.STEPS)
def test_sigkill_at_each_step_then_recover(tmp_path, step):
    root = new_repo(tmp_path / "r")
    base = git(root, "rev-parse", "HEAD")
    before = state(root)
    pid = _fork_checkpoint(root, base, step)
    _reap(pid)
    result = _check_after_kill(root, base, before)
    published = cp.STEPS.index(step) > cp.STEPS.index("publish")
    assert result == ("complete" if published else "before")


def test_random_sigkills_leave_before_or_complete(tmp_path):
    """Kills at random moments of the checkpoint (the runner process only, as the OOM killer
    or kill -9 would): after ``recover`` the repository is as before or fully checkpointed."""
    trials = int(os.environ.get("RUNNER_KILL_TRIALS", "200"))
    rng = random.Random(1234)
    root = new_repo(tmp_path / "r")
    base = git(root, "rev-parse", "HEAD")
    before = state(root)
    # how long one checkpoint takes here, to spread the kills over it
    started = time.monotonic()
    _reap(_fork_checkpoint(root, base, None))
    span = time.monotonic() - started
    _undo(root, base)
    assert state(root) == before
    seen = {"before": 0, "complete": 0}
    for _ in range(trials):
        pid = _fork_checkpoint(root, base, None)
        time.sleep(rng.uniform(0, span * 1.1))
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _reap(pid)
        seen[_check_after_kill(root, base, before)] += 1
        _undo(root, base)
        assert state(root) == before
    assert sum(seen.values()) == trials
    assert seen["before"] and seen["complete"], seen  # the kills did land on both sides


def _undo(root: Path, base: str) -> None:
    git(root, "tag", "-d", TAG, check=False)
    git(root, "update-ref", "refs/heads/main", base)
    git(root, "reset", "-q", base, "--", PLAN, "src", "reports")
    (root / PLAN).write_bytes(BEFORE)


# --- recover --------------------------------------------------------------------------------


def test_recover_tags_a_checkpoint_commit_left_without_its_tag(tmp_path):
    root = new_repo(tmp_path / "r")
    base = git(root, "rev-parse", "HEAD")
    run_checkpoint(root, base)
    git(root, "tag", "-d", TAG)
    found = cp.recover(root, plan_rel=PLAN)
    assert found.problems == [] and "tagged" in found.repaired[0]
    assert_complete(root, base)


def test_recover_finishes_a_plan_left_behind_head(tmp_path):
    """The old runner's SIGTERM case: commit and tag made, then the old plan written back."""
    root = new_repo(tmp_path / "r")
    base = git(root, "rev-parse", "HEAD")
    run_checkpoint(root, base)
    (root / PLAN).write_bytes(BEFORE)
    git(root, "reset", "-q", base, "--", PLAN)  # a staged reverse diff
    found = cp.recover(root, plan_rel=PLAN)
    assert found.problems == []
    assert_complete(root, base)


def test_recover_leaves_later_edits_and_deleted_tags_alone(tmp_path):
    """A plan edited after the checkpoint (a phase set back to pending, its tag deleted to run
    it again) or a rebased checkpoint whose tag names the original are not half-made states."""
    root = new_repo(tmp_path / "r")
    base = git(root, "rev-parse", "HEAD")
    run_checkpoint(root, base)
    (root / PLAN).write_bytes(b"my own edit: status: pending\n")
    git(root, "tag", "-d", TAG)
    before = state(root)
    assert cp.recover(root, plan_rel=PLAN) == cp.Recovery()
    assert state(root) == before
    git(root, "tag", TAG, base)  # the tag names another commit (the checkpoint was rebased)
    (root / PLAN).write_bytes(git(root, "show", f"HEAD:{PLAN}").encode() + b"\n")
    before = state(root)
    assert cp.recover(root, plan_rel=PLAN) == cp.Recovery()
    assert state(root) == before


def test_recover_reports_a_complete_phase_without_its_tag(tmp_path):
    root = new_repo(tmp_path / "r")
    found = cp.recover(root, plan_rel=PLAN, complete_tags=[TAG])
    assert found.problems and "never made" in found.problems[0]


def test_recover_on_a_clean_repository_does_nothing(tmp_path):
    root = new_repo(tmp_path / "r")
    before = state(root)
    assert cp.recover(root, plan_rel=PLAN) == cp.Recovery()
    assert state(root) == before


# --- messages -------------------------------------------------------------------------------


@pytest.mark.parametrize("evil", [
    "host\nRunner-Phase: forged", "host\r\nRunner-Phase: forged", "host\u2028Runner-Phase: forged",
    "host\x85Runner-Phase: forged", "\ud800host", "host\n\nRunner-Plan: x",
])
def test_message_fields_cannot_forge_trailers(tmp_path, evil):
    root = new_repo(tmp_path / "r")
    base = git(root, "rev-parse", "HEAD")
    message = cp.commit_message("demo", "alpha", "sha256:f", "m1", evil, evil, [(evil, "PASS")], {evil: evil})
    run_checkpoint(root, base, message=message)
    stored = git(root, "log", "-1", "--format=%B")
    trailers = git(root, "log", "-1", "--format=%(trailers:only,unfold)").splitlines()
    assert [line.split(":")[0] for line in trailers] == list(cp.TRAILER_KEYS)
    assert cp.parse_trailers(stored)["Runner-Phase"] == "alpha"
    assert cp.parse_trailers(stored)["Runner-Plan"] == "demo"


def test_recover_removes_the_plan_temp_files_of_dead_runners_only(tmp_path):
    from runner import atomic

    root = new_repo(tmp_path / "r")
    made: list[str] = []

    def killed(src, dst):  # the writer dies between writing its temp file and the rename
        made.append(Path(src).name)
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(atomic.os, "replace", killed)
        patch.setattr(atomic.Path, "unlink", lambda self, missing_ok=False: None)
        atomic.write_atomic_bytes(root / PLAN, b"half\n")
    [mine] = made
    dead = mine.replace(f"runner-{os.getpid()}-", "runner-999999999-")
    (root / "plans" / mine).rename(root / "plans" / dead)
    (root / "plans" / mine).write_bytes(b"a live writer's\n")
    cp.recover(root, plan_rel=PLAN)
    assert sorted(p.name for p in (root / "plans").iterdir()) == sorted(["p.md", mine])
    assert (root / PLAN).read_bytes() == BEFORE
