"""Where a run writes, checked before any gate runs: the phase's ``paths`` stay inside the
repository (the checkpoint commits them), the reports folder is a real folder of the repository
that git does not ignore, and the files and folders named by output options can be written.
"""

from __future__ import annotations

import os
from pathlib import Path

from runner.errors import PlanError, UsageError
from runner.plan.load import PlanDocument
from runner.plan.schema import Phase
from runner.repo.git import is_ignored


def check_paths(doc: PlanDocument, phase: Phase, repo_root: Path) -> None:
    """``PlanError`` at the phase's ``paths`` when one leaves the repository (absolute, ``..``,
    or through a symbolic link): the checkpoint commits them."""
    root = Path(os.path.realpath(repo_root))
    phase_index = next(i for i, candidate in enumerate(doc.plan.phases) if candidate.id == phase.id)
    for index, rel in enumerate(phase.paths):
        target = Path(os.path.realpath(root / rel))
        if Path(rel).is_absolute() or not _inside(target, root):
            line, column = doc.position("phases", phase_index, "paths", index) or (None, None)
            raise PlanError(
                f"path {rel!r} of phase {phase.id} is outside the repository ({target})",
                path=doc.path, line=line, column=column, key=f"phases[{phase_index}].paths[{index}]",
                hint="list folders and files inside the repository, relative to its root",
            )


def check_reports(repo_root: Path, reports_dir: str, run_parent: Path, plan_rel: str, *, git: bool) -> None:
    """``UsageError`` unless the run's folder (under ``run_parent``) could be made: inside the
    repository, below a folder (not a file) that can be written, and, in a git repository,
    neither the plan nor the reports folder ignored (the checkpoint commits both)."""
    root = Path(os.path.realpath(repo_root))
    probe = Path(run_parent)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    for folder in [probe, *probe.parents]:
        if folder.is_symlink() and not _inside(Path(os.path.realpath(folder)), root):
            raise UsageError(
                f"{folder} is a symbolic link to {os.path.realpath(folder)}, outside the repository; "
                f"the runner writes its reports only inside the repository: make {reports_dir}/ a "
                "real folder (or a link to one inside the repository)"
            )
        if Path(os.path.realpath(folder)) == root:
            break
    if not _inside(Path(os.path.realpath(probe)), root):
        raise UsageError(f"the reports folder {run_parent} lies outside the repository {root}")
    if not probe.is_dir():
        raise UsageError(
            f"{probe} is a file where the runner keeps its reports ({reports_dir}/<plan>/<phase>/); "
            "move it away or rename it"
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{probe} is not writable (a read-only mount?); the run's report could not be written there")
    if not git:
        return
    for rel, what in ((plan_rel, "the plan"), (f"{reports_dir}/x", f"the {reports_dir}/ folder")):
        if is_ignored(root, rel):
            raise UsageError(
                f"{what} is ignored by git (git check-ignore -v {rel}); the checkpoint commits it: "
                "remove the pattern from .gitignore"
            )


def check_outputs(*, files: dict[str, Path | None], folders: dict[str, Path | None]) -> None:
    """``UsageError`` for an output the command could not write: a file option naming a
    folder, a folder option naming a file, or a place that is not writable. Writes nothing."""
    for option, path in files.items():
        if path is None:
            continue
        path = Path(path)
        if path.is_dir():
            raise UsageError(f"{option} {path} is a folder; name a file")
        _writable(option, path.parent if not path.exists() else path, path)
    for option, path in folders.items():
        if path is None:
            continue
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise UsageError(f"{option} {path} is a file; name a folder")
        _writable(option, path, path)


def _writable(option: str, place: Path, given: Path) -> None:
    probe = place
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir() and probe != given:
        raise UsageError(f"{option} {given}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | (os.X_OK if probe.is_dir() else 0)):
        raise UsageError(f"{option} {given}: {probe} is not writable")


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False
