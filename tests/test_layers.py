"""The campaign's import graph: the layers of docs/ARCHITECTURE.md, checked from the source.

Layers, from the base up (a module imports only its own room, rooms of lower layers, and
never a peer room of its own layer):

0. ``kernel``: the kernel library;
1. ``serving.configs`` (the checkpoint's config) and ``serving.device`` (device, timers);
2. ``serving.quant``, ``serving.kv``, ``serving.parallel`` and ``serving.sampling`` (sampling
   parameters and the on-device sampler);
3. ``serving.attention``;
4. ``serving.model``;
5. ``serving.speculation``;
6. ``serving.engine``;
7. ``serving.graphs`` and ``serving.defrag``, the engine's two wings;
8. ``serving.stack`` (and ``serving.__main__``) and ``serving.demo``;
9. ``phases``: gate code. A phase imports no other phase's modules; what several phases share
   lives in ``phases.common``, which imports no phase;
10. ``phases.frontier``: the last phase measures the others' code against the state of the art,
    so it may import their gate modules; no phase imports it.

Also: the test oracle (``kernel.reference``) stays out of ``serving``; outside ``kernel/``,
code imports the kernel only through its public surface (``kernel``, ``kernel.bench_api`` for
gate and benchmark code, ``kernel.reference`` for the oracle) and never a private (``_``) name;
the serving and phase import graph has no cycle. Edges are read from the source (``import x`` /
``from x import y`` at any depth, so a lazy import in a function counts; ``if TYPE_CHECKING:``
blocks do not).
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("kernel", "serving", "phases")
ORACLE = "kernel.reference"


def group_of(module: str) -> str:
    """The layer group a module belongs to: 'kernel', 'serving.engine', 'serving.graphs',
    'serving.defrag', 'serving.stack', 'serving' (the package itself), 'phases.common',
    'phases.<phase>' or 'phases'."""
    parts = module.split(".")
    if parts[0] == "kernel":
        return "kernel"
    if parts[0] == "serving":
        if len(parts) == 1 or parts[1] == "__main__":
            return "serving.stack" if len(parts) > 1 else "serving"
        return "serving." + parts[1]
    if parts[0] == "phases":
        return "phases" if len(parts) == 1 else "phases." + parts[1]
    raise AssertionError(f"{module} is in no package of {PACKAGES}")


# serving.demo (the demo model's trainer) sits beside the stack: it imports none of serving, and
# the speculation gates import it.
RANK = {
    "kernel": 0,
    "serving.configs": 1, "serving.device": 1,
    "serving.quant": 2, "serving.kv": 2, "serving.parallel": 2, "serving.sampling": 2,
    "serving.attention": 3,
    "serving.model": 4,
    "serving.speculation": 5,
    "serving.engine": 6,
    "serving.graphs": 7, "serving.defrag": 7,
    "serving.stack": 8, "serving.demo": 8,
}
PHASES_RANK = 9
FRONTIER = "phases.frontier"
# The kernel's public surface for code outside kernel/: the package (serving and gates), the
# named door for gate and benchmark code that needs internals, and the oracle.
KERNEL_SURFACE = ("kernel", "kernel.bench_api", ORACLE)


def rank_of(group: str) -> int:
    if group.startswith("serving.") and group not in RANK:
        raise AssertionError(f"{group} is a serving room missing from RANK: give it a layer")
    if group == FRONTIER:
        return PHASES_RANK + 1
    return RANK.get(group, PHASES_RANK)  # every other phases.* group


def allowed(source: str, target: str) -> str | None:
    """None when ``source`` may import ``target``, else the rule it breaks."""
    a, b = group_of(source), group_of(target)
    if target == ORACLE and a.startswith("serving"):
        return "the test oracle kernel.reference stays in tests and gates"
    if b == "kernel" and a != "kernel" and target not in KERNEL_SURFACE:
        return f"outside kernel/ only the public surface ({', '.join(KERNEL_SURFACE)}) is imported, not {target}"
    if a == b or b in ("serving", "phases"):
        return None
    if rank_of(b) > rank_of(a):
        return f"{a} is below {b}"
    if rank_of(a) == rank_of(b):
        if a.startswith("phases.") and b == "phases.common":
            return None
        return f"{a} and {b} are peers that do not import each other"
    return None


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST, module: str, is_package: bool):
    skip: set[int] = set()
    for node in ast.walk(tree):  # TYPE_CHECKING blocks: annotations only, never executed
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for child in node.body for n in ast.walk(child)}
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            yield name
            for alias in node.names:  # "from pkg import module"
                yield f"{name}.{alias.name}"


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the project modules it imports (packages kernel, serving, phases under ``root``)."""
    paths = {_module_name(p, root): p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = set()
        for name in _imports(tree, module, path.name == "__init__.py"):
            if name in paths and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def violations(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} imports {b}: {why}" for a, targets in graph.items() for b in targets
                  if (why := allowed(a, b)) is not None)


def test_the_campaign_keeps_its_layers():
    assert violations(import_graph()) == []


def test_serving_and_phases_have_no_import_cycle():
    graph = {a: {b for b in t if not b.startswith("kernel")} for a, t in import_graph().items() if not a.startswith("kernel")}
    # A package's __init__ re-exporting its modules is not a cycle of behaviour: drop package -> own module edges.
    graph = {a: {b for b in t if not b.startswith(a + ".")} for a, t in graph.items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")


@pytest.mark.parametrize("source, line, rule", [
    ("serving/graphs/runner.py", "from serving.defrag import Defragmenter", "peers"),
    ("serving/engine/engine.py", "from serving.graphs import CudaGraphs", "below"),
    ("serving/speculation/tree.py", "from kernel.reference import tree_mask_from_parents", "oracle"),
    ("phases/backend/greedy.py", "from phases.cudagraph.decode_speed import label", "peers"),
    ("phases/common/greedy.py", "import phases.defrag.stamped_pool", "peers"),
    ("phases/speculation/speculation.py", "import phases.frontier.mtp_tree", "below"),
    ("kernel/plan.py", "from serving.kv.batch import StepBatch", "below"),
    ("serving/kv/pool.py", "from serving.parallel.group import TensorParallel", "peers"),
    ("serving/configs/model.py", "from serving.device.timing import IntervalTimer", "peers"),
    ("serving/device/timing.py", "from serving.configs.model import ModelConfig", "peers"),
    ("serving/quant/fp8.py", "from serving.model.limits import estimate", "below"),
    ("serving/attention/backends.py", "from serving.model.deepseek_v3 import DeepseekV3Model", "below"),
    ("serving/model/deepseek_v3.py", "from serving.speculation.tree import DraftTree", "below"),
    ("serving/speculation/drafters.py", "from serving.engine.model_runner import ModelRunner", "below"),
    ("serving/engine/model_runner.py", "from serving.stack.config import ServingConfig", "below"),
    ("serving/engine/engine.py", "from kernel.plan import HeadDims", "surface"),
    ("phases/kernel/build.py", "from kernel.hopper import compile_for_sm90", "surface"),
])
def test_a_planted_import_breaks_a_rule(tmp_path, source, line, rule):
    """A copy of the packages with one import planted: the check names it."""
    import shutil

    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.md", "*.json"))
    target = tmp_path / source
    target.write_text(target.read_text() + f"\n\ndef _planted():\n    {line}\n")
    found = violations(import_graph(tmp_path))
    assert len(found) == 1 and found[0].startswith(_module_name(target, tmp_path)) and rule in found[0]


# Code outside kernel/ that may import the kernel: the packages and the tests and doc examples.
OUTSIDE_KERNEL = ("serving", "phases", "tests", "docs")


def private_kernel_uses(root: Path = ROOT) -> list[str]:
    """Where code outside ``kernel/`` imports a private (``_``) name or module of the kernel, or
    reads a private attribute off a kernel module it imported."""
    found = []
    for folder in OUTSIDE_KERNEL:
        for path in sorted((root / folder).rglob("*.py")):
            where = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text(), where)
            modules: set[str] = set()  # local names bound to kernel modules
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "kernel":
                    private_module = any(part.startswith("_") for part in node.module.split("."))
                    for alias in node.names:
                        if private_module or (alias.name.startswith("_") and not alias.name.startswith("__")):
                            found.append(f"{where}:{node.lineno}: from {node.module} import {alias.name}")
                        modules.add(alias.asname or alias.name)
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.split(".")[0] == "kernel":
                            if any(part.startswith("_") for part in alias.name.split(".")):
                                found.append(f"{where}:{node.lineno}: import {alias.name}")
                            modules.add(alias.asname or alias.name.split(".")[0])
            for node in ast.walk(tree):
                if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                        and node.attr.startswith("_") and not node.attr.startswith("__")):
                    found.append(f"{where}:{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_code_outside_the_kernel_uses_a_private_kernel_name():
    assert private_kernel_uses() == []


@pytest.mark.parametrize("source, line", [
    ("phases/kernel/build.py", "from kernel.triton_kernels import _mla_verify_split_kernel"),
    ("serving/attention/backends.py", "from kernel import _interpreter_compat"),
    ("tests/kernel/test_plan.py", "from kernel.bench_api import hopper; hopper._split_kernel"),
])
def test_a_planted_private_kernel_use_is_caught(tmp_path, source, line):
    import shutil

    for folder in OUTSIDE_KERNEL:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__", "*.json", "*.md"))
    target = tmp_path / source
    target.write_text(target.read_text() + f"\n\ndef _planted():\n    {line}\n")
    found = private_kernel_uses(tmp_path)
    assert len(found) == 1 and found[0].startswith(source), found
