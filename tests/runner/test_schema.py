"""The plan models: defaults, invariants and lookups."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from runner.errors import UsageError
from runner.plan.schema import SCHEMA_VERSION, Checkpoint, Gate, Phase, Plan
from runner.plan.thresholds import Threshold


def _gate(**overrides: Any) -> dict[str, Any]:
    return {"name": "g", "kind": "verify", "run": "true", **overrides}


def _plan(*phases: dict[str, Any]) -> dict[str, Any]:
    return {"schema": 1, "id": "demo", "phases": list(phases) or [{"id": "one", "gates": [_gate()]}]}


def test_defaults() -> None:
    plan = Plan.model_validate(_plan())
    assert plan.schema_version == SCHEMA_VERSION == 1
    phase = plan.phases[0]
    assert (phase.title, phase.status, phase.paths, phase.headline, phase.checkpoint) == ("", "pending", [], None, None)
    gate = phase.gates[0]
    assert gate.timeout == 3600
    assert (gate.args, gate.env, gate.requires, gate.expect) == ({}, {}, [], {})


def test_schema_key_is_serialized_under_its_alias() -> None:
    plan = Plan.model_validate(_plan())
    assert plan.model_dump(by_alias=True)["schema"] == 1
    assert Plan(schema_version=1, id="demo", phases=plan.phases) == plan


def test_headline_metrics_default_to_expected_metrics_in_order() -> None:
    gates = [
        _gate(name="a", expect={"speedup": ">= 1", "errors": "== 0"}),
        _gate(name="b", expect={"errors": "== 0", "bw": "> 0.5"}),
    ]
    phase = Phase.model_validate({"id": "p", "gates": gates})
    assert phase.headline_metrics() == ["speedup", "errors", "bw"]
    assert phase.model_copy(update={"headline": ["bw"]}).headline_metrics() == ["bw"]
    assert phase.gates[0].expect["speedup"] == Threshold.parse(">= 1")


def test_lookups_name_the_known_ids() -> None:
    plan = Plan.model_validate(_plan({"id": "a", "gates": [_gate()]}, {"id": "b", "gates": [_gate()]}))
    assert plan.phase("b").id == "b"
    assert plan.phase("a").gate("g").name == "g"
    with pytest.raises(UsageError, match="no phase 'c'.*a, b"):
        plan.phase("c")
    with pytest.raises(UsageError, match="no gate 'x'"):
        plan.phase("a").gate("x")


@pytest.mark.parametrize(
    ("gate", "fragment"),
    [
        ({"name": "g", "kind": "verify"}, "exactly one of 'run'"),
        (_gate(call="a.b:c"), "exactly one of 'run'"),
        (_gate(run=None, call="a.b"), "should match pattern"),
        (_gate(run=None, call="a b:c"), "should match pattern"),
        (_gate(args={"x": 1}), "'args' only applies"),
        (_gate(kind="bench"), "'build', 'verify' or 'benchmark'"),
        (_gate(name="-x"), "should match pattern"),
        (_gate(timeout=0), "greater than 0"),
        (_gate(timeout="900"), "valid number"),
        (_gate(env={"A": 1}), "valid string"),
        (_gate(expect={"x": 5}), "bare value"),
        (_gate(colour="red"), "Extra inputs"),
    ],
)
def test_gate_invariants(gate: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        Gate.model_validate(gate)


def test_call_gate_with_args_is_valid() -> None:
    gate = Gate.model_validate(_gate(run=None, call="pkg.mod:run_bench", args={"quick": True}))
    assert gate.call == "pkg.mod:run_bench"


@pytest.mark.parametrize(
    ("plan", "fragment"),
    [
        ({**_plan(), "schema": 2}, "Input should be 1"),
        ({k: v for k, v in _plan().items() if k != "schema"}, "Field required"),
        (_plan({"id": "a", "gates": [_gate()]}, {"id": "a", "gates": [_gate()]}), "phase id 'a' is used twice"),
        (_plan({"id": "a", "gates": [_gate(), _gate()]}), "gate name 'g' is used twice"),
        (_plan({"id": "a", "gates": []}), "at least 1 item"),
        (_plan({"id": "a", "status": "done", "gates": [_gate()]}), "'pending', 'complete'"),
        ({**_plan(), "phases": []}, "at least 1 item"),
    ],
)
def test_plan_invariants(plan: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        Plan.model_validate(plan)


def test_checkpoint_time_read_as_datetime_becomes_text() -> None:
    import datetime as dt

    checkpoint = Checkpoint(
        tag="t", base="b", fingerprint="f", report="r", time=dt.datetime(2026, 11, 29, 23, 50, tzinfo=dt.timezone.utc)
    )
    assert checkpoint.time == "2026-11-29T23:50:00Z"


def test_models_are_frozen() -> None:
    plan = Plan.model_validate(_plan())
    with pytest.raises(ValidationError):
        plan.phases[0].status = "complete"  # type: ignore[misc]


def test_requires_splits_devices_from_modules() -> None:
    gate = Gate.model_validate(_gate(requires=["cuda", "module:flash_mla", "module:flashinfer.mla"]))
    assert gate.required_devices() == ["cuda"]
    assert gate.required_modules() == ["flash_mla", "flashinfer.mla"]


@pytest.mark.parametrize("entry", ["module:", "module:9lives", "module:flash-mla", "module:a..b", "module: x"])
def test_a_module_requirement_must_name_a_module(entry: str) -> None:
    with pytest.raises(ValidationError, match="names no Python module"):
        Gate.model_validate(_gate(requires=["cuda", entry]))
