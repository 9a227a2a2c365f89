"""``runner status``: every phase's status, last checkpoint and headline metrics. Reads only.

The checkpoint commit is resolved from the phase's tag when the root is a git repository (a
commit cannot name its own hash, so the plan records the tag); elsewhere it is ``None``. With a
commit, ``changed`` lists the files under the phase's ``paths`` that differ from it now: the
checkpoint's evidence is of other code than the tree's (DVC's "changed" stage), so the phase
is due to be recorded again.

Decisions:
- Without the tag (a clone that fetched no tags, as CI checkouts often are) the commit is the
  one that added the checkpoint's report (``git.adding_commit``: a checkpoint commits its report),
  taken only when its parent is the plan's ``base`` and its plan holds this checkpoint's tag,
  time and fingerprint; a shallow clone's first commit "adds" every file and fails the parent
  check. ``commit_from`` says which way it was found; ``tag_missing`` stays true, so status still
  asks for the tag. When neither way finds it, nothing is claimed: ``changed`` is ``None``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from runner.errors import GitError
from runner.plan.order import next_phase
from runner.plan.schema import Checkpoint
from runner.repo import git
from runner.workspace import Workspace


@dataclass(frozen=True)
class CheckpointView:
    """A phase's checkpoint as the plan records it, with ``commit`` resolved from its tag in
    git (``None`` outside git or when the tag is missing). The one checkpoint view: ``runner
    status``, ``runner history`` and the HTML report all show this."""

    phase: str
    tag: str
    time: str
    base: str
    fingerprint: str
    report: str
    commit: str | None
    metrics: dict[str, bool | int | float | str]
    open_targets: dict[str, dict] = field(default_factory=dict)  # metric -> OpenTarget.record()
    changed: list[str] | None = None  # files under the phase's paths changed since ``commit``; None: unknown
    tag_missing: bool = False  # in git, but the tag names no commit
    commit_from: str | None = None  # "tag", or "report" (found without the tag, see Decisions), None: not found

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PhaseView:
    id: str
    title: str
    status: str
    next: bool
    gates: list[str]
    checkpoint: CheckpointView | None


@dataclass(frozen=True)
class StatusView:
    plan_id: str
    plan_title: str
    plan_path: str
    next_phase: str | None
    phases: list[PhaseView]

    def to_json(self) -> dict:
        """A JSON-ready dict (``runner status --json``)."""
        return {
            "plan": {"id": self.plan_id, "title": self.plan_title, "path": self.plan_path},
            "next": self.next_phase,
            "phases": [asdict(phase) for phase in self.phases],
        }


def plan_status(ws: Workspace) -> StatusView:
    """The status of every phase of the plan in ``ws``."""
    plan = ws.plan
    upcoming = next_phase(plan)
    phases = []
    for phase in plan.phases:
        checkpoint = None
        if phase.checkpoint is not None:
            record = phase.checkpoint
            in_git = (ws.root / ".git").exists()
            commit = _tag_commit(ws, record.tag)
            commit_from = "tag" if commit else None
            if commit is None and in_git:
                commit = _report_commit(ws, record)
                commit_from = "report" if commit else None
            checkpoint = CheckpointView(
                phase=phase.id,
                tag=record.tag,
                time=record.time,
                base=record.base,
                fingerprint=record.fingerprint,
                report=record.report,
                commit=commit,
                metrics=dict(record.metrics),
                open_targets={name: target.record() for name, target in record.open_targets.items()},
                changed=_changed(ws, commit, phase.paths),
                tag_missing=commit_from != "tag" and in_git,
                commit_from=commit_from,
            )
        phases.append(
            PhaseView(
                id=phase.id,
                title=phase.title,
                status=phase.status,
                next=upcoming is not None and phase.id == upcoming.id,
                gates=[gate.name for gate in phase.gates],
                checkpoint=checkpoint,
            )
        )
    return StatusView(
        plan_id=plan.id,
        plan_title=plan.title,
        plan_path=ws.plan_rel,
        next_phase=upcoming.id if upcoming else None,
        phases=phases,
    )


def _tag_commit(ws: Workspace, tag: str) -> str | None:
    """The commit ``tag`` names, ``None`` outside git or when the tag is missing."""
    if not (ws.root / ".git").exists():
        return None
    try:
        return git.tag_commit(ws.root, tag)
    except GitError:
        return None


def _report_commit(ws: Workspace, record: Checkpoint) -> str | None:
    """The checkpoint's commit found without its tag (see Decisions), or ``None``."""
    commit = git.adding_commit(ws.root, record.report)
    if commit is None or git.rev(ws.root, f"{commit}^") != record.base:
        return None
    plan = git.blob(ws.root, commit, ws.plan_rel) or b""
    return commit if all(value.encode() in plan for value in (record.tag, record.time, record.fingerprint)) else None


def _changed(ws: Workspace, commit: str | None, paths: list[str]) -> list[str] | None:
    """Files under ``paths`` changed since ``commit``, the runner's own records apart (the plan
    and ``reports/``, which later checkpoints change, as the fingerprint leaves them out);
    ``None`` without a commit or when git cannot tell (a commit missing from a shallow clone)."""
    if commit is None:
        return None
    try:
        changed = git.changed_since(ws.root, commit, paths)
    except GitError:
        return None
    return [name for name in changed if not ws.is_record(name)]
