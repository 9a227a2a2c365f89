"""Deciding what runs: which phase is next and which of its gates can run here.

Pure functions of the plan, the set of devices this machine has and the Python modules each
gate's interpreter finds (looked up beforehand by ``runner.gates.requirements``); the executor
runs the resulting steps in order and stops at the first failure.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Literal

from runner.plan.schema import GATE_KINDS, Gate, Phase, Plan

GateAction = Literal["run", "blocked"]

_KIND_ORDER = {kind: rank for rank, kind in enumerate(GATE_KINDS)}  # build, verify, benchmark


@dataclass(frozen=True)
class GateStep:
    """One gate of a run and whether it runs; ``reason`` says why it is blocked ("" if it runs)."""

    gate: Gate
    action: GateAction
    reason: str


def next_phase(plan: Plan) -> Phase | None:
    """The first phase (in plan order) that is not ``complete``; ``None`` when all are.

    A later phase being complete does not skip an earlier incomplete one.
    """
    return next((phase for phase in plan.phases if phase.status != "complete"), None)


def ordered_gates(phase: Phase) -> list[Gate]:
    """The phase's gates: build, then verify, then benchmark; plan order within a kind."""
    return sorted(phase.gates, key=lambda gate: _KIND_ORDER[gate.kind])


def plan_run(
    phase: Phase, devices: frozenset[str], modules: Mapping[str, Collection[str]] | None = None,
    only: Collection[str] | None = None,
) -> list[GateStep]:
    """The steps of a run of ``phase`` on a machine with ``devices``, in order; with ``only``,
    of those of its gates alone (``runner gate --only``).

    ``modules`` maps a gate's name to the modules of its ``module:NAME`` requirements that its
    interpreter finds; a gate it does not name finds none, so a module nobody looked up blocks
    its gate and never lets it pass. A gate whose ``requires`` names a device not in ``devices``
    or a module it does not find is blocked, with each missing one named. A benchmark is also
    blocked when a verify gate of the phase is blocked, because a benchmark runs only after its
    phase's verify gates pass in the same run. A verify gate that ``only`` leaves out blocks
    nothing: it may run in another job, whose results are imported with these
    (``runner.records.combine`` holds the benchmark to it there).
    """
    steps: list[GateStep] = []
    blocked_verify: list[str] = []
    for gate in ordered_gates(phase):
        if only is not None and gate.name not in only:
            continue
        found = (modules or {}).get(gate.name, ())
        lacking = missing_reason(
            sorted(set(gate.required_devices()) - devices),
            [name for name in gate.required_modules() if name not in found],
        )
        if lacking:
            step = GateStep(gate, "blocked", lacking)
            if gate.kind == "verify":
                blocked_verify.append(gate.name)
        elif gate.kind == "benchmark" and blocked_verify:
            step = GateStep(
                gate,
                "blocked",
                f"verify gate(s) {', '.join(blocked_verify)} cannot run here; a benchmark runs "
                "only after its phase's verify gates pass in the same run",
            )
        else:
            step = GateStep(gate, "run", "")
        steps.append(step)
    return steps


def missing_reason(devices: list[str], modules: list[str]) -> str:
    """Why a gate lacking ``devices`` and ``modules`` is blocked ("" when it lacks none)."""
    parts = []
    if devices:
        parts.append(f"needs {', '.join(devices)}, which this machine lacks")
    if modules:
        noun = "module" if len(modules) == 1 else "modules"
        parts.append(f"needs Python {noun} {', '.join(modules)}, which the gate's interpreter does not find "
                     "(not installed or not on its PYTHONPATH)")
    return "; ".join(parts)
