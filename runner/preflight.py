"""Checks made before a phase runs: every ``call:`` gate of it names code that exists.

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
nothing: the gate itself reports it.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import sys
from collections.abc import Iterator
from importlib.machinery import ModuleSpec
from pathlib import Path

from runner.errors import PlanError
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
        defined = _defined_after_import(spec, function)
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


def _defined_after_import(spec: ModuleSpec, name: str) -> bool | None:
    """Run the module here (not registered in ``sys.modules``) and look; ``None`` when it
    cannot be run on its own (its import fails, or it needs its package imported first)."""
    if spec.loader is None:
        return None
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (Exception, SystemExit):  # noqa: BLE001 - what a module raises is the gate's problem
        return None
    return hasattr(module, name)
