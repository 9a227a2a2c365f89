"""What the tests of the shipped plan's sampled benchmark gates share: the plan's gate, the sample
count the gate reports, checks of a reported sampled metric, and planted sample sets that the
runner must judge on the interval of their median."""

from __future__ import annotations

import importlib
import inspect
import math
from pathlib import Path

PLAN = Path(__file__).resolve().parents[1] / "plans" / "0002-mla-verify-kernel-defrag.md"

# The benchmark gates that report their thresholded metrics as samples: (phase, gate).
SAMPLED_GATES = (("cudagraph", "overhead"), ("cudagraph", "decode-speed"), ("defrag", "speed"),
                 ("speculation", "speculation"))


def plan_gate(phase: str, gate: str):
    """The shipped plan's gate, as the runner reads it."""
    from runner.plan import load as planfile

    return planfile.load_plan(PLAN).plan.phase(phase).gate(gate)


def gate_samples(gate) -> int:
    """How many samples the gate reports as the plan runs it (its args, else its default)."""
    module, _, function = gate.call.partition(":")
    run = getattr(importlib.import_module(module), function)
    return gate.args.get("samples", inspect.signature(run).parameters["samples"].default)


def assert_samples(metrics: dict, name: str, count: int, low: float = 0.0) -> list[float]:
    """``metrics[name]`` is a list of ``count`` finite numbers above ``low``; returns it."""
    value = metrics[name]
    assert isinstance(value, list), (name, value)
    assert len(value) == count, (name, value)
    assert all(isinstance(v, float | int) and not isinstance(v, bool) and math.isfinite(v) and v > low
               for v in value), (name, value)
    return value


def planted(threshold, count: int, passing: bool) -> list[float]:
    """``count`` samples around ``threshold``: all on its good side (``passing``), or with the lower
    half less one on its bad side, so the median still passes as a single number and the interval
    of the median does not."""
    step = max(abs(threshold.value) * 0.1, 0.01)
    sign = 1.0 if threshold.op in (">=", ">") else -1.0
    good = [threshold.value + sign * step * (1 + 0.01 * i) for i in range(count)]
    if passing:
        return good
    bad = (count - 1) // 2
    return [threshold.value - sign * step] * bad + good[bad:]
