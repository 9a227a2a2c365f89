"""The runner's import graph: the layers of docs/ARCHITECTURE.md (a module imports only its own
layer and the ones below), no cycles, read-only modules above no execution, the CLI on top.

Edges are read from the source (``from runner.x import ...`` and ``import runner.x``, at any
depth of the module), so a lazy import inside a function counts too.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

import runner

RUNNER = Path(runner.__file__).resolve().parent  # the installed runner, or this checkout's

# The foundation: imports nothing of the runner but these (a gate imports gatekit).
BASE = {"runner", "runner.errors", "runner.timeutil", "runner.formatting", "runner.protocol", "runner.atomic",
        "runner.untrusted", "runner.gatekit"}
# Read-only views: they must not pull in gate execution, locking or the use cases.
READ_ONLY = {"runner.workspace", "runner.views.status", "runner.views.history", "runner.views.runs",
             "runner.views.html", "runner.views.diff", "runner.views.plots", "runner.records.run_folder",
             "runner.formatting"}
EXECUTION = {"runner.gates.execute", "runner.runs", "runner.check", "runner.advance", "runner.repo.lock",
             "runner.gates.verdict", "runner.gates.procgroup", "runner.gates.log"}

# The layers of docs/ARCHITECTURE.md, from the base up: module names, or "pkg.*" for a group.
LAYERS = [
    ("base", BASE | {"runner.templating"}),
    ("plan", {"runner.plan.*"}),
    ("repo", {"runner.repo.*"}),
    ("records", {"runner.records.*"}),
    ("gates", {"runner.gates.*"}),
    ("context", {"runner.workspace", "runner.runs", "runner.phase_run"}),
    ("views", {"runner.views.*"}),
    ("use cases", {"runner.advance", "runner.evidence", "runner.check", "runner.gate_out"}),
    ("command line", {"runner.cli", "runner.cli.*", "runner.__main__"}),
]


def layer_of(module: str) -> int:
    """The index in ``LAYERS`` of ``module``: its own name first, else its group's."""
    for index, (_, members) in enumerate(LAYERS):
        if module in members:
            return index
    for index, (_, members) in enumerate(LAYERS):
        if any(member.endswith(".*") and (module + ".").startswith(member[:-1]) for member in members):
            return index
    raise AssertionError(f"{module} is in no layer of LAYERS (docs/ARCHITECTURE.md)")


def _module_name(path: Path) -> str:
    parts = path.relative_to(RUNNER.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(path): path for path in RUNNER.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    child = f"{node.module}.{alias.name}"
                    targets.append(child if child in modules else node.module)
            elif isinstance(node, ast.Import):
                targets += [alias.name for alias in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


GRAPH = import_graph()


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every (importer, imported) pair whose imported module lies in a layer above the importer's."""
    return sorted((module, target) for module, targets in graph.items() for target in targets
                  if layer_of(target) > layer_of(module))


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_a_module_imports_only_its_layer_and_the_ones_below(module):
    own = layer_of(module)
    above = {target for target in GRAPH[module] if layer_of(target) > own}
    assert above == set(), f"{module} ({LAYERS[own][0]}) imports from a layer above it: {above}"


def test_the_runner_has_no_upward_import():
    assert upward_imports(GRAPH) == []


def test_a_planted_upward_import_is_caught():
    planted = {module: set(targets) for module, targets in GRAPH.items()}
    planted["runner.records.results"].add("runner.gates.execute")
    # the old layout: base code filed under gates/, imported by records/
    planted["runner.gates.protocol"] = set()
    planted["runner.records.run_folder"].add("runner.gates.protocol")
    assert upward_imports(planted) == [("runner.records.results", "runner.gates.execute"),
                                       ("runner.records.run_folder", "runner.gates.protocol")]


def test_a_module_sits_in_its_folders_layer():
    """A module named in a layer of its own lies in no folder that ``LAYERS`` files under another
    layer: code of the base filed under ``gates/`` would make every import of it look upward."""
    for index, (name, members) in enumerate(LAYERS):
        for module in (member for member in members if not member.endswith(".*")):
            folders = [other for other, (_, group) in enumerate(LAYERS) if any(
                member.endswith(".*") and module.startswith(member[:-1]) for member in group)]
            assert folders in ([], [index]), f"{module} is filed under {name} but lies in {LAYERS[folders[0]][0]}'s folder"


def test_no_cycles():
    graphlib.TopologicalSorter(GRAPH).prepare()  # raises CycleError naming the cycle


@pytest.mark.parametrize("module", sorted(BASE))
def test_base_modules_import_only_the_base(module):
    assert GRAPH[module] - BASE - {"runner"} == set()


@pytest.mark.parametrize("module", sorted(READ_ONLY))
def test_read_only_modules_reach_no_execution(module):
    assert reachable(GRAPH, module) & EXECUTION == set()


def test_only_the_cli_imports_the_cli():
    for module, targets in GRAPH.items():
        if not module.startswith("runner.cli") and module != "runner.__main__":
            assert not {t for t in targets if t.startswith("runner.cli")}, module


def test_one_clock_only_timeutil_reads_the_time():
    """``runner.timeutil`` is the one UTC clock: no other module calls ``datetime.now``."""
    for path in RUNNER.rglob("*.py"):
        if path.name == "timeutil.py":
            continue
        assert "datetime.now(" not in path.read_text(encoding="utf-8"), path


