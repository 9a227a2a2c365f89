"""Where a run writes, checked before any gate runs: the phase's ``paths`` stay inside the
repository (the checkpoint commits them), the reports folder is a real folder of the repository
that git does not ignore, and the files and folders named by output options can be written.

Decisions:

- A run's folder is reached through no symbolic link (``check_run_folder``), not even one that
  stays inside the repository: the fingerprint leaves ``reports/`` out by its name, so what a
  run writes through ``reports -> out/reports`` would land in ``out/``, change the fingerprint
  and fail a phase whose gates all passed; git cannot commit a path beyond a link either. The
  HTML page (``runner report``) is no run and may follow a link that stays inside.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

from runner.errors import PlanError, UsageError
from runner.plan.load import PlanDocument
from runner.plan.schema import Phase
from runner.repo.git import ignore_rule, is_ignored, is_tracked


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


def check_paths_committable(doc: PlanDocument, phase: Phase, repo_root: Path) -> None:
    """``PlanError`` at a path of the phase that git ignores (the checkpoint's ``git add`` would
    refuse it after every gate passed), naming the rule; a tracked file git still commits. A
    path that does not exist yet (a gate may make it) is refused when git would ignore it as a
    file or as a folder."""
    root = Path(repo_root)
    phase_index = next(i for i, candidate in enumerate(doc.plan.phases) if candidate.id == phase.id)
    for index, rel in enumerate(phase.paths):
        clean = posixpath.normpath(rel)
        if clean == ".":
            continue
        target = root / clean
        exists = target.exists() or target.is_symlink()
        rule = ignore_rule(root, clean) or (None if exists else ignore_rule(root, clean + "/"))
        if rule is None or (not target.is_dir() and is_tracked(root, clean)):
            continue
        line, column = doc.position("phases", phase_index, "paths", index) or (None, None)
        raise PlanError(
            f"path {rel!r} of phase {phase.id} is ignored by git ({rule}; see git check-ignore -v "
            f"--no-index {clean}), so the checkpoint could not commit it",
            path=doc.path, line=line, column=column, key=f"phases[{phase_index}].paths[{index}]",
            hint="remove that rule from the ignore file, or take the path out of the phase's paths",
        )


def check_results_outside_paths(phase: Phase, repo_root: Path, results_path: Path) -> None:
    """``UsageError`` when the results file of ``advance --results`` lies under one of the
    phase's paths: the checkpoint commits those paths as the gates tested them, and the results
    file is no part of the tested tree (it is left out of the fingerprint, as ``--out`` is
    where it was made), so it would be refused there after every check passed."""
    root = Path(os.path.realpath(repo_root))
    results = Path(os.path.realpath(results_path))
    for rel in phase.paths:
        place = Path(os.path.realpath(root / rel))
        if results == place or _inside(results, place):
            raise UsageError(
                f"--results {results_path} lies inside {rel!r}, a path of phase {phase.id} that the "
                "checkpoint commits; the results file is not part of the tree its gates ran on: "
                "move it outside the phase's paths (the repository root or another folder) and "
                "run advance again"
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
                "real folder"
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


def check_run_folder(repo_root: Path, reports_dir: str, run_parent: Path) -> None:
    """``UsageError`` when a folder between the repository root and ``run_parent`` (where a
    run's folder is made) is a symbolic link (see the module's decisions)."""
    root = Path(repo_root)
    try:
        rel = Path(run_parent).relative_to(root)
    except ValueError:
        return  # check_reports refuses what lies outside
    folder = root
    for part in rel.parts:
        folder = folder / part
        if folder.is_symlink():
            shown = folder.relative_to(root).as_posix()
            raise UsageError(
                f"{shown} is a symbolic link (to {os.readlink(folder)}); the runner keeps each run in a "
                f"real folder under {reports_dir}/, because the tree's fingerprint leaves out "
                f"{reports_dir}/ by its name and git commits no path through a link: replace the "
                f"link with the folder it names (rm {shown} && mv <its target> {shown})"
            )
        if not folder.exists():
            return


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
