"""Deciding what runs: which phase is next and which of its gates can run here.

Pure functions of the plan and the set of devices this machine has; the executor runs
the resulting steps in order and stops at the first failure.
"""

from __future__ import annotations

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


def plan_run(phase: Phase, devices: frozenset[str]) -> list[GateStep]:
    """The steps of a run of ``phase`` on a machine with ``devices``, in order.

    A gate whose ``requires`` names a device not in ``devices`` is blocked. A benchmark is
    also blocked when a verify gate of the phase is blocked, because a benchmark runs only
    after its phase's verify gates pass in the same run.
    """
    steps: list[GateStep] = []
    blocked_verify: list[str] = []
    for gate in ordered_gates(phase):
        missing = sorted(set(gate.requires) - devices)
        if missing:
            step = GateStep(gate, "blocked", f"needs {', '.join(missing)}, which this machine lacks")
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
