"""Pure planning: the next phase, gate order and which gates are blocked."""

from __future__ import annotations

from typing import Any

import pytest

from runner.plan.order import GateStep, next_phase, ordered_gates, plan_run
from runner.plan.schema import Phase, Plan


def _plan(*statuses: str) -> Plan:
    phases = [
        {"id": f"p{index}", "status": status, "gates": [{"name": "g", "kind": "verify", "run": "true"}]}
        for index, status in enumerate(statuses)
    ]
    return Plan.model_validate({"schema": 1, "id": "demo", "phases": phases})


@pytest.mark.parametrize(
    ("statuses", "expected"),
    [
        (("pending", "pending"), "p0"),
        (("complete", "pending"), "p1"),
        (("complete", "failed", "pending"), "p1"),
        (("complete", "failed"), "p1"),
        (("complete", "blocked", "complete"), "p1"),
        (("pending", "complete", "complete"), "p0"),  # a later complete phase does not skip p0
        (("complete", "complete"), None),
    ],
)
def test_next_phase(statuses: tuple[str, ...], expected: str | None) -> None:
    phase = next_phase(_plan(*statuses))
    assert (phase.id if phase else None) == expected


def _phase(*gates: dict[str, Any]) -> Phase:
    return Phase.model_validate({"id": "p", "gates": list(gates)})


def _gate(name: str, kind: str, *requires: str) -> dict[str, Any]:
    return {"name": name, "kind": kind, "run": "true", "requires": list(requires)}


def test_ordered_gates_by_kind_then_plan_order() -> None:
    phase = _phase(
        _gate("bench1", "benchmark"),
        _gate("verify1", "verify"),
        _gate("build1", "build"),
        _gate("bench2", "benchmark"),
        _gate("verify2", "verify"),
        _gate("build2", "build"),
    )
    assert [gate.name for gate in ordered_gates(phase)] == ["build1", "build2", "verify1", "verify2", "bench1", "bench2"]


def _actions(steps: list[GateStep]) -> list[tuple[str, str]]:
    return [(step.gate.name, step.action) for step in steps]


def test_everything_runs_when_devices_are_present() -> None:
    phase = _phase(_gate("bench", "benchmark", "cuda"), _gate("check", "verify", "cuda"), _gate("make", "build"))
    steps = plan_run(phase, frozenset({"cuda"}))
    assert _actions(steps) == [("make", "run"), ("check", "run"), ("bench", "run")]
    assert all(step.reason == "" for step in steps)


def test_missing_device_blocks_the_gate_and_names_the_device() -> None:
    phase = _phase(_gate("make", "build"), _gate("check", "verify", "cuda", "h200"), _gate("cpu-check", "verify"))
    steps = plan_run(phase, frozenset({"cuda"}))
    assert _actions(steps) == [("make", "run"), ("check", "blocked"), ("cpu-check", "run")]
    assert "h200" in steps[1].reason and "cuda" not in steps[1].reason


def test_benchmark_is_blocked_when_a_verify_gate_is_blocked() -> None:
    phase = _phase(_gate("bench", "benchmark"), _gate("check", "verify", "cuda"), _gate("make", "build"))
    steps = plan_run(phase, frozenset())
    assert _actions(steps) == [("make", "run"), ("check", "blocked"), ("bench", "blocked")]
    assert "check" in steps[2].reason and "verify" in steps[2].reason


def test_benchmark_runs_without_verify_gates_and_blocks_on_its_own_devices() -> None:
    phase = _phase(_gate("fast", "benchmark"), _gate("gpu", "benchmark", "cuda"))
    assert _actions(plan_run(phase, frozenset())) == [("fast", "run"), ("gpu", "blocked")]


def test_missing_module_blocks_the_gate_and_names_the_module() -> None:
    phase = _phase(_gate("bench", "benchmark", "cuda", "module:flash_mla", "module:flashinfer"), _gate("make", "build"))
    steps = plan_run(phase, frozenset({"cuda"}), {"bench": frozenset({"flashinfer"})})
    assert _actions(steps) == [("make", "run"), ("bench", "blocked")]
    assert "module flash_mla" in steps[1].reason and "flashinfer" not in steps[1].reason
    assert "cuda" not in steps[1].reason


def test_found_modules_let_the_gate_run() -> None:
    phase = _phase(_gate("bench", "benchmark", "cuda", "module:flash_mla"))
    steps = plan_run(phase, frozenset({"cuda"}), {"bench": frozenset({"flash_mla"})})
    assert _actions(steps) == [("bench", "run")] and steps[0].reason == ""


def test_a_module_nobody_looked_up_blocks_and_devices_and_modules_are_both_named() -> None:
    phase = _phase(_gate("bench", "benchmark", "cuda", "module:flash_mla"))
    assert _actions(plan_run(phase, frozenset({"cuda"}))) == [("bench", "blocked")]
    [step] = plan_run(phase, frozenset(), {"bench": frozenset({"flash_mla"})})
    assert step.reason == "needs cuda, which this machine lacks"
    [step] = plan_run(phase, frozenset())
    assert step.reason.startswith("needs cuda, which this machine lacks; needs Python module flash_mla")


def test_a_verify_gate_blocked_on_a_module_blocks_the_benchmark() -> None:
    phase = _phase(_gate("bench", "benchmark"), _gate("check", "verify", "module:numpy_that_is_not_here"))
    steps = plan_run(phase, frozenset({"cuda"}), {})
    assert _actions(steps) == [("check", "blocked"), ("bench", "blocked")]
