"""Result models: derived phase outcome, threshold checks and the results file's JSON I/O."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from runner.errors import ResultsError
from runner.plan.thresholds import Threshold
from runner.records.checks import check_thresholds
from runner.records.machine import MachineInfo
from runner.records.results import (
    GateResult,
    PhaseResults,
    ResultsFile,
    combine_outcomes,
)

MACHINE = MachineInfo(hostname="h", platform="Linux-x", arch="x86_64", python="3.11.7",
                      cpu_count=8, devices=["cpu", "cuda"], gpu_name="NVIDIA H200",
                      gpu_count=1, driver="550.1", cuda="12.4", torch="2.5.1", triton="3.1.0")


def gate(name: str, outcome: str = "PASS", **metrics) -> GateResult:
    return GateResult(name=name, kind="verify", outcome=outcome, reason="r", metrics=metrics,
                      checks=[], started="2024-05-01T10:00:00.000Z", duration_s=1.5,
                      exit_code=0, signal=None, log=f"{name}.log", log_tail="tail")


def results(*phases: PhaseResults) -> ResultsFile:
    return ResultsFile(tool="mla-gate 0.1.0", plan_id="p", plan_path="plans/p.md", run_id="20240501T100000Z-00000000",
                       created="2024-05-01T10:00:00Z", fingerprint="sha256:" + "0" * 64,
                       machine=MACHINE, phases=list(phases))


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        ([], "PASS"),
        (["PASS", "PASS"], "PASS"),
        (["PASS", "BLOCKED"], "BLOCKED"),
        (["BLOCKED", "ERROR"], "ERROR"),
        (["ERROR", "FAIL", "BLOCKED"], "FAIL"),
        (["FAIL", "SKIPPED"], "FAIL"),
        (["SKIPPED", "SKIPPED"], "SKIPPED"),
        (["PASS", "SKIPPED"], "PASS"),
    ],
)
def test_combine_outcomes(outcomes, expected):
    assert combine_outcomes(outcomes) == expected


def test_phase_outcome_is_derived_and_checked():
    phase = PhaseResults(phase="k", gates=[gate("a"), gate("b", "FAIL"), gate("c", "SKIPPED")])
    assert phase.outcome == "FAIL"
    with pytest.raises(ValidationError, match="does not follow from its gates"):
        PhaseResults(phase="k", outcome="PASS", gates=[gate("a"), gate("b", "ERROR")])
    assert PhaseResults(phase="k", outcome="ERROR", gates=[gate("b", "ERROR")]).outcome == "ERROR"


def test_models_forbid_unknown_keys():
    data = gate("a").model_dump()
    with pytest.raises(ValidationError):
        GateResult.model_validate(data | {"surprise": 1})


def test_check_thresholds_reasons():
    expect = {name: Threshold.parse(">= 1.5") for name in
              ["ok", "low", "missing", "nan", "inf", "flag", "text", "null"]}
    metrics = {"ok": 2, "low": 1.2, "nan": math.nan, "inf": math.inf, "flag": True,
               "text": "fast", "null": None, "extra": 5}
    checks = {c.metric: c for c in check_thresholds(expect, metrics)}
    assert list(checks) == list(expect)  # plan order, unreported extras ignored
    assert checks["ok"].ok and checks["ok"].threshold == ">= 1.5" and checks["ok"].value == 2
    assert [name for name, c in checks.items() if c.ok] == ["ok"]
    assert checks["low"].reason == "1.2 is not >= 1.5"
    assert checks["missing"].reason == "not reported" and checks["missing"].value is None
    assert checks["nan"].reason == "is NaN"
    assert checks["inf"].reason == "is infinite"
    assert "boolean" in checks["flag"].reason
    assert "string" in checks["text"].reason
    assert "null" in checks["null"].reason


def test_results_file_round_trip_keeps_nan(tmp_path):
    nan_gate = gate("bench", "FAIL", speedup=math.nan, label="x", exact=True, n=3)
    file = results(PhaseResults(phase="kernel", gates=[gate("build"), nan_gate]))
    path = tmp_path / "out" / "results.json"
    file.dump(path)
    text = path.read_text()
    assert text.startswith("{\n  ")  # indented
    assert '"speedup": NaN' in text
    loaded = ResultsFile.load(path)
    assert math.isnan(loaded.phases[0].gates[1].metrics["speedup"])
    metrics = loaded.phases[0].gates[1].metrics
    assert (type(metrics["exact"]), type(metrics["n"]), type(metrics["label"])) == (bool, int, str)
    assert loaded.phases[0].outcome == "FAIL"
    assert loaded.machine == MACHINE
    assert loaded.model_dump(exclude={"phases"}) == file.model_dump(exclude={"phases"})
    assert [p.name for p in path.parent.iterdir()] == ["results.json"]  # no temp file left


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "cannot read"),
        ("{oops", "not valid JSON"),
        ("[1, 2]", "JSON object, got list"),
        ('{"results_schema": 99}', "unknown results_schema 99"),
        ('{"tool": "x"}', "unknown results_schema None"),
    ],
)
def test_load_errors(tmp_path, content, needle):
    path = tmp_path / "results.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ResultsError, match=needle) as info:
        ResultsFile.load(path)
    assert str(path) in str(info.value)


def test_load_reports_invalid_fields(tmp_path):
    path = tmp_path / "results.json"
    data = json.loads(results(PhaseResults(phase="k", gates=[gate("a")])).model_dump_json())
    data["phases"][0]["gates"][0]["outcome"] = "MAYBE"
    del data["fingerprint"]
    path.write_text(json.dumps(data))
    with pytest.raises(ResultsError) as info:
        ResultsFile.load(path)
    message = str(info.value)
    assert "phases.0.gates.0.outcome" in message and "fingerprint" in message


def test_results_dump_is_atomic_and_creates_folders(tmp_path):
    from runner.atomic import write_atomic

    target = tmp_path / "deep" / "er" / "results.json"
    write_atomic(target, "{}\n", make_parents=True)
    assert target.read_text() == "{}\n" and sorted(p.name for p in target.parent.iterdir()) == ["results.json"]
    with pytest.raises(OSError):
        write_atomic(tmp_path / "missing" / "x.json", "{}")
