"""``phases/<phase>/`` holds its gate modules, named after their gates, and helpers they share;
hand-run tools live in ``phases/<phase>/bench/`` (or ``phases/common`` for shared code)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "plans" / "0002-mla-verify-kernel-defrag.md"


def gate_modules(plan_path: Path = PLAN) -> dict[str, str]:
    """Each ``call:`` gate's module -> the gate's phase/name (``kernel/verify``)."""
    from runner.plan import load as planfile

    plan = planfile.load_plan(plan_path).plan
    return {gate.call.partition(":")[0]: f"{phase.id}/{gate.name}" for phase in plan.phases for gate in phase.gates
            if gate.call}


def naming_problems(plan_path: Path = PLAN) -> list[str]:
    """Gates whose module is not named after them. A gate that runs another gate's module on other
    arguments is named ``<module>-<variant>`` (``greedy-fp8`` runs ``greedy``)."""
    from runner.plan import load as planfile

    problems = []
    for phase in planfile.load_plan(plan_path).plan.phases:
        for gate in phase.gates:
            if not gate.call:
                continue
            module = gate.call.partition(":")[0]
            expected_folder = f"phases.{phase.id}"
            folder, _, name = module.rpartition(".")
            stem = gate.name.replace("-", "_")
            if folder != expected_folder:
                problems.append(f"{phase.id}/{gate.name}: its module {module} is not in {expected_folder}")
            elif name != stem and not stem.startswith(name + "_"):
                problems.append(f"{phase.id}/{gate.name}: its module is {module}, not {expected_folder}.{stem}")
    return problems


def folder_problems(root: Path = ROOT, plan_path: Path = PLAN) -> list[str]:
    """Modules directly in a phase's folder that are neither its gates' modules nor helpers: a
    module with a ``__main__`` block that no gate calls is a hand-run tool, which goes in bench/."""
    gates = gate_modules(plan_path)
    problems = []
    for path in sorted((root / "phases").glob("*/*.py")):
        if path.parent.name == "common" or path.name == "__init__.py":
            continue
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        if module in gates:
            continue
        tree = ast.parse(path.read_text(), str(path))
        runs_as_script = any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body)
        if runs_as_script:
            problems.append(f"{path.relative_to(root)}: a hand-run tool beside the gates; move it to "
                            f"{path.parent.relative_to(root)}/bench/")
    return problems


def test_each_gate_module_has_its_gates_name():
    assert naming_problems() == []


def test_no_hand_run_tool_shares_a_folder_with_the_gates():
    assert folder_problems() == []


def test_a_planted_tool_beside_the_gates_is_named(tmp_path):
    import shutil

    shutil.copytree(ROOT / "phases", tmp_path / "phases", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "phases" / "cudagraph" / "table.py").write_text('def main():\n    pass\n\n\nif __name__ == "__main__":\n    main()\n')
    assert folder_problems(tmp_path) == ["phases/cudagraph/table.py: a hand-run tool beside the gates; move it to "
                                         "phases/cudagraph/bench/"]


@pytest.mark.parametrize("old, new, problem", [
    ("call: phases.cudagraph.replay:run", "call: phases.cudagraph.decode_speed:run", "cudagraph/replay: its module is"),
    ("call: phases.frontier.peers:run", "call: phases.kernel.benchmark:run", "frontier/peers: its module phases.kernel"),
])
def test_a_planted_misnamed_gate_is_named(tmp_path, old, new, problem):
    text = PLAN.read_text()
    assert old in text
    planted = tmp_path / "plan.md"
    planted.write_text(text.replace(old, new, 1))
    found = naming_problems(planted)
    assert len(found) == 1 and found[0].startswith(problem), found
