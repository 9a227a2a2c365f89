"""Checked before a phase runs: every ``call:`` gate of it names code that exists.

A misspelled ``module:function`` would otherwise surface only when the gate runs, possibly
after an hour of other gates, as an ERROR. ``check_calls`` turns it into a ``PlanError`` at the
gate's line and column, before anything runs. Only the phase about to run is checked: later
phases may name code that is not written yet.

Modules are found the way the gate's child process will import them (the repository root
first, ``runner.gates.modules``, then this interpreter's ``sys.path``) without importing them:
each dotted part is looked up with ``importlib.machinery.PathFinder`` in the folders of the part before it, so no package
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

from runner.errors import PlanError
from runner.gates.modules import root_spec
from runner.plan.load import PlanDocument
from runner.plan.schema import Phase


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
    """Why ``module:function`` cannot be called from folders ``search`` (the repository root
    first), with a fix; ``None`` when it can (or when that cannot be told without running it)."""
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
        if depth == 1:  # the repository root first, as the gate's child takes it
            spec = root_spec(prefix, search[0]) or importlib.machinery.PathFinder.find_spec(prefix, path)
            spec = spec or _builtin_spec(prefix)
        else:
            spec = importlib.machinery.PathFinder.find_spec(prefix, path)
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
