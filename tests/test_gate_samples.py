"""Benchmark gates that report samples: the shared helpers (``phases.common.samples``), and the
runner judging every threshold and target of the shipped plan's sampled gates on the interval of
the median, with as many samples as each gate reports."""

from __future__ import annotations

import statistics

import pytest

from phases.common.engines import metrics_table
from phases.common.samples import (
    SAMPLES,
    check_count,
    interleaved,
    median,
    median_index,
    ratios,
    table_value,
)
from runner.plan.samples import min_samples
from runner.records.checks import check_thresholds
from tests.sampled_gates import SAMPLED_GATES, gate_samples, plan_gate, planted


def test_interleaved_alternates_the_order_round_by_round():
    calls = []
    out = interleaved({"a": lambda: calls.append("a") or len(calls), "b": lambda: calls.append("b") or len(calls)}, 4)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert out == {"a": [1, 4, 5, 8], "b": [2, 3, 6, 7]}


def test_counts_ratios_and_medians():
    assert check_count(1) == 1
    for bad in (0, -3, 2.0, True):
        with pytest.raises(ValueError):
            check_count(bad)
    assert ratios([2.0, 9.0], [1.0, 3.0]) == [2.0, 3.0]
    with pytest.raises(ValueError):
        ratios([1.0], [1.0, 2.0])
    assert median([3.0, 1.0, 2.0]) == 2.0 and median(4.5) == 4.5
    assert median_index([5.0, 1.0, 3.0, 9.0]) == 2  # the lower median, 3.0


def test_report_tables_show_samples_as_their_median():
    assert table_value([1.0, 3.0, 2.0]) == "2 (median of 3)"
    assert table_value(0.123456) == "0.1235" and table_value(12) == "12" and table_value("never") == "never"
    assert "| speedup | 2 (median of 3) |" in metrics_table({"speedup": [1.0, 3.0, 2.0], "steps": 4})


def test_the_default_count_is_enough_for_the_runners_default_confidence():
    assert SAMPLES >= min_samples(0.95)


@pytest.mark.parametrize(("phase", "name"), SAMPLED_GATES)
def test_plan_thresholds_are_judged_on_the_interval_of_the_gates_samples(phase, name):
    """Samples of the gate's count, all beyond each threshold, pass it; the same count with the
    lower half (less one) on the wrong side fails it, though their median alone would pass."""
    gate = plan_gate(phase, name)
    count = gate_samples(gate)
    assert count >= min_samples(gate.confidence), (phase, name, count)
    for thresholds in (gate.expect, gate.targets):
        for metric, threshold in thresholds.items():
            (good,) = check_thresholds({metric: threshold}, {metric: planted(threshold, count, True)}, gate.confidence)
            assert good.ok and good.samples == count and good.interval is not None, good
            low = planted(threshold, count, False)
            assert threshold.check(statistics.median(low))
            (bad,) = check_thresholds({metric: threshold}, {metric: low}, gate.confidence)
            assert not bad.ok and "over the interval" in bad.reason, bad
