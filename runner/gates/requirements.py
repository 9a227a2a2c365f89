"""Whether a gate's ``module:NAME`` requirements hold here: its interpreter finds the modules.

A gate that needs an optional package (``requires: [cuda, "module:flash_mla"]``) is BLOCKED
where the package is missing, with the module named, instead of running and failing on an
``ImportError``. The planner (``runner.plan.order.plan_run``) stays pure: this module looks the
names up beforehand and hands it, per gate, the names that were found.

Decisions:

- The lookup runs where the gate will: a child of this runner's interpreter (``sys.executable``,
  which also starts every ``call:`` gate), in the repository root, with the gate's own
  environment (``runner.gates.execute.gate_environment``: the repository root and the runner's
  folder first on ``PYTHONPATH``, then the caller's ``PYTHONPATH`` and the gate's ``env:``). A
  ``run:`` gate whose command starts another interpreter is judged by this one.
- "Finds" is ``importlib.util.find_spec(name) is not None``: the module is installed and on
  the path. Its code does not run (only the parent packages of a dotted name are imported), so
  the lookup costs no torch import, and a module that is installed but fails to import makes
  the gate fail, where the failure shows, rather than hide behind BLOCKED.
- A lookup that cannot answer (the child fails, hangs past ``timeout_s`` or prints something
  else) finds nothing: its gate is blocked, never run on a guess.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from runner.gates.execute import gate_environment
from runner.plan.schema import Phase
from runner.records.machine import child_json

# Runs in the child; prints the names it finds as one JSON list on its last stdout line.
_FIND_SCRIPT = r"""
import importlib.util, json, sys
found = []
for name in sys.argv[1:]:
    try:
        if importlib.util.find_spec(name) is not None:
            found.append(name)
    except Exception:  # a parent package that fails to import: not found
        pass
print(json.dumps(found))
"""


def found_modules(
    phase: Phase, repo_root: Path, extra_env: Mapping[str, str] | None = None, timeout_s: float = 60
) -> dict[str, frozenset[str]]:
    """For each gate of ``phase`` with ``module:`` requirements, the required modules its
    interpreter finds (see the module docstring); gates without such requirements are absent."""
    return {
        gate.name: find_modules(gate.required_modules(), gate_environment(gate, repo_root, extra_env), repo_root,
                                timeout_s=timeout_s)
        for gate in phase.gates
        if gate.required_modules()
    }


def find_modules(names: list[str], env: Mapping[str, str], cwd: Path, timeout_s: float = 60) -> frozenset[str]:
    """The names in ``names`` that a child of this interpreter, run in ``cwd`` with ``env``, finds."""
    if not names:
        return frozenset()
    found = child_json([sys.executable, "-c", _FIND_SCRIPT, *names], timeout_s, cwd=cwd, env=env)
    if not isinstance(found, list):
        return frozenset()
    return frozenset(name for name in found if name in names)
