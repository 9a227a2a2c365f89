"""Checks made before a phase runs: every ``call:`` gate of it names code that exists, its
``paths`` stay inside the repository, the reports folder is a real folder of the repository
that git does not ignore, and the output files a command writes can be written.

A misspelled ``module:function`` would otherwise surface only when the gate runs, possibly
after an hour of other gates, as an ERROR. ``check_calls`` turns it into a ``PlanError`` at the
gate's line and column, before anything runs. Only the phase about to run is checked: later
phases may name code that is not written yet.

Modules are found the way the gate's child process will import them (the repository root
first, then this interpreter's ``sys.path``) without importing them: each dotted part is looked
up with ``importlib.machinery.PathFinder`` in the folders of the part before it, so no package
``__init__`` runs. The function is then looked for in the module's source (top-level ``def``,
``class``, assignment or import). Only when the source cannot answer (a C extension, a
``from x import *``, a module ``__getattr__``, a name made at run time) is the module imported
in the runner's process to look at the attribute, and an import that fails there proves
nothing: the gate itself reports it. That import runs in a child process with a time limit,
never in the runner's: a module that exits or blocks at import cannot end or hang the runner.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from importlib.machinery import ModuleSpec
from pathlib import Path

from runner.errors import PlanError, UsageError
from runner.planfile import PlanDocument
from runner.schema import Phase


def check_calls(doc: PlanDocument, phase: Phase, repo_root: Path) -> None:
    """Raise ``PlanError`` at the gate's ``call`` value if a callable gate of ``phase`` names
    a module or a function that does not exist under ``repo_root`` (or on ``sys.path``)."""
    phase_index = next(i for i, candidate in enumerate(doc.plan.phases) if candidate.id == phase.id)
    search = [str(Path(repo_root).resolve()), *(entry for entry in sys.path if entry)]
    for gate_index, gate in enumerate(phase.gates):
        if gate.call is None:
            continue
        problem = call_problem(gate.call, search)
        if problem is None:
            continue
        message, hint = problem
        loc = ("phases", phase_index, "gates", gate_index, "call")
        line, column = doc.position(*loc) or (None, None)
        raise PlanError(
            f"call {gate.call!r}: {message}",
            path=doc.path,
            line=line,
            column=column,
            key=f"phases[{phase_index}].gates[{gate_index}].call",
            hint=hint,
        )


def call_problem(target: str, search: list[str]) -> tuple[str, str] | None:
    """Why ``module:function`` cannot be called from folders ``search``, with a fix; ``None``
    when it can (or when that cannot be told without running the code)."""
    module_name, _, function = target.partition(":")
    spec, problem = _find_module(module_name, search)
    if problem is not None or spec is None:
        return problem
    defined = _defined_in_source(spec, function)
    if defined is None:
        defined = _defined_after_import(spec, function, cwd=Path(search[0]) if search else None)
    if defined is False:
        where = spec.origin or module_name
        return (
            f"module {module_name!r} ({where}) has no attribute {function!r}",
            f"define {function}() in it, or fix the name after the ':'",
        )
    return None


def _find_module(name: str, search: list[str]) -> tuple[ModuleSpec | None, tuple[str, str] | None]:
    """The module's spec, or the problem finding it; ``(None, None)`` when it cannot tell."""
    parts = name.split(".")
    path: list[str] | None = search
    spec: ModuleSpec | None = None
    for depth in range(1, len(parts) + 1):
        prefix = ".".join(parts[:depth])
        if path is None:
            return None, None  # a module, not a package (os.path): only an import can tell
        spec = importlib.machinery.PathFinder.find_spec(prefix, path)
        if spec is None and depth == 1:
            spec = _builtin_spec(prefix)
        if spec is None:
            relative = "/".join(parts[:depth])
            return None, (
                f"no module named {prefix!r}",
                f"create {relative}.py (or the package {relative}/) or fix the module path before the ':'",
            )
        path = list(spec.submodule_search_locations) if spec.submodule_search_locations is not None else None
    return spec, None


def _builtin_spec(name: str) -> ModuleSpec | None:
    for finder in (importlib.machinery.BuiltinImporter, importlib.machinery.FrozenImporter):
        spec = finder.find_spec(name)
        if spec is not None:
            return spec
    return None


def _defined_in_source(spec: ModuleSpec, name: str) -> bool | None:
    """Whether the module's source defines ``name`` at top level; ``None`` when it cannot tell."""
    origin = spec.origin
    if not origin or not origin.endswith(".py"):
        return None
    try:
        tree = ast.parse(Path(origin).read_bytes(), filename=origin)
    except (OSError, SyntaxError, ValueError):
        return None  # the gate's import will report it with a traceback
    undecidable = False
    for node in _top_level(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                return True
            undecidable |= node.name == "__getattr__"
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    undecidable = True
                elif (alias.asname or alias.name.split(".")[0]) == name:
                    return True
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(name in _names(target) for target in targets):
                return True
    if undecidable or spec.submodule_search_locations is not None:
        return None  # a star import, a module __getattr__, or a package (submodule attribute)
    return None if _mentions_globals(tree) else False


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Top-level statements, including those inside top-level ``if``/``try``/``with`` blocks."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.With, ast.AsyncWith)):
            yield from _top_level(node.body)
            yield from _top_level(getattr(node, "orelse", []))
        elif isinstance(node, ast.Try) or (sys.version_info >= (3, 11) and isinstance(node, ast.TryStar)):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _top_level(block)
            for handler in node.handlers:
                yield from _top_level(handler.body)


def _names(target: ast.AST) -> set[str]:
    return {node.id for node in ast.walk(target) if isinstance(node, ast.Name)}


def _mentions_globals(tree: ast.Module) -> bool:
    """``globals()`` or ``setattr(sys.modules[...])`` style tricks: names made at run time."""
    return any(
        isinstance(node, ast.Name) and node.id in ("globals", "setattr", "vars") for node in ast.walk(tree)
    )


IMPORT_CHECK_TIMEOUT_S = 30.0

_IMPORT_CHECK = """
import importlib.util, os, sys
name, origin, attr, package = sys.argv[1:5]
sys.path.insert(0, os.getcwd())
locations = [os.path.dirname(origin)] if package == "1" else None
spec = importlib.util.spec_from_file_location(name, origin, submodule_search_locations=locations)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
sys.stdout.write("\\nrunner-preflight:%d\\n" % hasattr(module, attr))
sys.stdout.flush()
os._exit(0)
"""


def _defined_after_import(spec: ModuleSpec, name: str, cwd: Path | None = None) -> bool | None:
    """Import the module in a child process (not registered as its package's submodule) and
    look; ``None`` when it cannot tell: its import fails, exits, or takes longer than
    ``IMPORT_CHECK_TIMEOUT_S``."""
    origin = spec.origin
    if spec.loader is None or not origin or not os.path.isfile(origin):
        return None
    package = "1" if spec.submodule_search_locations is not None else "0"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _IMPORT_CHECK, spec.name, origin, name, package],
            cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, timeout=IMPORT_CHECK_TIMEOUT_S,
            start_new_session=True,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    tail = proc.stdout[-64:].decode("ascii", "replace").strip().splitlines()
    if proc.returncode != 0 or not tail or not tail[-1].startswith("runner-preflight:"):
        return None
    return tail[-1].endswith(":1")


# --- where the run writes --------------------------------------------------------------------


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
    """``UsageError`` unless the run's folder (under ``run_parent``) would lie inside the
    repository and, in a git repository, neither the plan nor the reports folder is ignored
    (the checkpoint commits both)."""
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
    if not git:
        return
    for rel, what in ((plan_rel, "the plan"), (f"{reports_dir}/x", f"the {reports_dir}/ folder")):
        proc = subprocess.run(["git", "check-ignore", "-q", "--no-index", "--", rel], cwd=root,
                              capture_output=True, check=False)
        if proc.returncode == 0:
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
