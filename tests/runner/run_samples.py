"""Synthetic runs under ``reports/<plan>/<phase>/<run-id>/results.json`` for history, diff,
report and JUnit tests, and the sample project under ``tests/runner/data/sample/``: a frozen
plan and a real H200 run, so no runner test reads the campaign's ``plans/`` or ``reports/``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runner.plan.load import load_plan
from runner.records.results import GateResult, PhaseResults, ResultsFile
from runner.workspace import Workspace
from tests.runner.repo_fixtures import fake_machine

ROOT = Path(__file__).resolve().parents[2]
"""The repository root (for ``PYTHONPATH`` of gate processes that import ``runner``)."""
SAMPLE_ROOT = Path(__file__).resolve().parent / "data" / "sample"
SAMPLE_PLAN = SAMPLE_ROOT / "plans" / "sample.md"
REAL_RUN = SAMPLE_ROOT / "reports" / "mla-verify" / "kernel" / "20261130T001525Z-a7576174"
REAL_RESULTS = REAL_RUN / "results.json"


def sample_workspace() -> Workspace:
    """The sample project as a workspace (its root has no ``.git`` of its own)."""
    return Workspace(SAMPLE_ROOT, SAMPLE_PLAN, load_plan(SAMPLE_PLAN))


def gate_result(name: str, kind: str = "verify", outcome: str = "PASS", **fields: Any) -> GateResult:
    data: dict[str, Any] = {
        "name": name, "kind": kind, "outcome": outcome, "reason": f"reason of {name}", "metrics": {},
        "checks": [], "started": "2026-11-29T23:50:00.000Z", "duration_s": 1.5, "exit_code": 0,
        "signal": None, "log": None, "log_tail": "",
    }
    data.update(fields)
    return GateResult.model_validate(data)


def results(
    *, run_id: str, created: str, gates: list[GateResult], phase: str = "alpha", plan_id: str = "demo",
    gpu: str | None = None, fingerprint: str = "sha256:" + "ab" * 32,
) -> ResultsFile:
    machine = fake_machine()
    if gpu is not None:
        machine = machine.model_copy(update={"gpu_name": gpu, "gpu_count": 1, "devices": ["cpu", "cuda"]})
    return ResultsFile(
        tool="test", plan_id=plan_id, plan_path="plans/demo.md", run_id=run_id, created=created,
        fingerprint=fingerprint, machine=machine, phases=[PhaseResults(phase=phase, gates=gates)],
    )


def write_run(root: Path, run: ResultsFile, phase: str = "alpha") -> Path:
    """Store ``run`` as the reports folder would; return its ``results.json``."""
    path = root / "reports" / run.plan_id / phase / run.run_id / "results.json"
    run.dump(path)
    return path


def check_run(root: Path, run_id: str, created: str, speedup: float, errors: int = 0, **kwargs: Any) -> Path:
    """A run of the default plan's ``alpha`` phase (gates build and check)."""
    metrics = {"speedup": speedup, "errors": errors}
    outcome = "PASS" if speedup >= 1.5 and errors == 0 else "FAIL"
    gates = [gate_result("build", "build"), gate_result("check", "verify", outcome, metrics=metrics)]
    return write_run(root, results(run_id=run_id, created=created, gates=gates, **kwargs))
