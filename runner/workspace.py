"""The context every command starts from: the repository root, the plan file and the plan.

``open_workspace`` finds the root (the nearest folder with ``.git``, or the start folder on a
GPU host that holds a plain copy of the tree) and the plan, and loads it. ``Workspace`` also
computes the tree fingerprint with the plan file and ``reports/`` left out. Reads only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from runner.plan.load import PlanDocument, find_plan, load_plan
from runner.plan.schema import Plan
from runner.records.run_folder import REPORTS_DIR
from runner.repo.fingerprint import TreeState, tree_state

def find_repo_root(start: Path | None = None) -> Path:
    """The nearest folder from ``start`` (default: the working directory) upwards that has a
    ``.git``; ``start`` itself when there is none (a GPU host's copy of the tree)."""
    start = Path(start or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return start


@dataclass(frozen=True)
class Workspace:
    """The repository root, the plan file and the plan as loaded."""

    root: Path
    plan_path: Path
    doc: PlanDocument

    @property
    def plan(self) -> Plan:
        return self.doc.plan

    @property
    def plan_rel(self) -> str:
        """The plan's path relative to the root (POSIX), or absolute when it lies outside."""
        try:
            return self.plan_path.resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return str(self.plan_path)

    def fingerprint(self, also_exclude: Sequence[Path] = ()) -> str:
        """The tree fingerprint, without the plan file and ``reports/`` (``tree_state``)."""
        return self.tree_state(also_exclude).fingerprint

    def tree_state(self, also_exclude: Sequence[Path] = ()) -> TreeState:
        """The tree's files and fingerprint, without the plan file and ``reports/``.

        ``also_exclude`` names the runner's own files for this command (a results file, a logs
        folder): those inside the root are left out too, so writing or copying them into the
        tree does not change the fingerprint.
        """
        exclude = self.records()
        for path in also_exclude:
            try:
                exclude.append(Path(path).resolve().relative_to(self.root.resolve()).as_posix())
            except ValueError:
                continue  # outside the tree: not part of the fingerprint anyway
        return tree_state(self.root, exclude=exclude)

    def records(self) -> list[str]:
        """The runner's own records, left out of the tree fingerprint: the plan file and ``reports/``
        (POSIX paths relative to the root)."""
        return [self.plan_rel, REPORTS_DIR]

    def is_record(self, rel: str) -> bool:
        """Whether ``rel`` (POSIX, relative to the root) is one of ``records`` or under one."""
        return any(rel == record or rel.startswith(record.rstrip("/") + "/") for record in self.records())

    def reload(self) -> Workspace:
        return Workspace(self.root, self.plan_path, load_plan(self.plan_path))


def open_workspace(plan: Path | None = None, cwd: Path | None = None) -> Workspace:
    """Find the root from ``cwd``, the plan (``find_plan``) and load it."""
    root = find_repo_root(cwd)
    explicit = plan
    if explicit is not None and cwd is not None and not explicit.is_absolute():
        explicit = Path(cwd) / explicit
    plan_path = find_plan(root, explicit)
    return Workspace(root, plan_path, load_plan(plan_path))
