"""``repeat: N``: one gate run N times, each number it reports collected into samples.

Decisions:

- Each repetition is a whole run of the gate (its own process group, ``timeout``, metrics
  file), judged as a run without thresholds; the thresholds are judged once, on the metrics
  of all repetitions merged (``runner.plan.samples.merge_repetitions``), at the gate's
  ``confidence``.
- The first repetition that does not pass ends the gate with its outcome and reason
  (``repetition 2 of 5: exited with code 1``); the later ones do not run.
- One log per gate, as for any gate: each repetition writes its own capped log in a scratch
  folder, which is appended to the gate's log after a ``[runner] repetition k of N`` line as
  soon as it ends (an interrupted repetition's too). The artifacts are the last repetition's.
- Samples stay bounded: a metric that collects more than ``MAX_SAMPLES`` over the repetitions
  keeps its first ``MAX_SAMPLES`` and the gate is an ERROR (it could not be judged as asked).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.gates.verdict import metrics_hint, threshold_verdict
from runner.plan.samples import DEFAULT_CONFIDENCE, MAX_SAMPLES, merge_repetitions
from runner.records.checks import check_thresholds
from runner.records.results import GateResult


class _Unjudged:
    """A gate as one repetition runs it: the same in every way but without thresholds."""

    expect: dict = {}
    targets: dict = {}

    def __init__(self, gate: Any) -> None:
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gate, name)


def run_repeated(gate: Any, *, run_gate_fn: Callable[..., GateResult], log_path: Path, **kwargs: Any) -> GateResult:
    """``run_gate_fn(gate, log_path=log_path, **kwargs)``, ``gate.repeat`` times (see the
    module docstring); a gate without ``repeat`` (or with 1) runs once, as it always did."""
    repeat = int(getattr(gate, "repeat", 1) or 1)
    if repeat <= 1:
        return run_gate_fn(gate, log_path=log_path, **kwargs)
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_bytes(b"")
    runs: list[GateResult] = []
    with tempfile.TemporaryDirectory(prefix="runner-repeat-") as scratch:
        for index in range(1, repeat + 1):
            part = Path(scratch) / f"{index}.log"
            try:
                runs.append(run_gate_fn(_Unjudged(gate), log_path=part, **kwargs))
            finally:
                _append(log_path, part, f"[runner] repetition {index} of {repeat}")
            if runs[-1].outcome != "PASS":
                break
    return _combined(gate, runs, repeat, _relative(log_path, kwargs.get("report_dir")))


def _combined(gate: Any, runs: list[GateResult], repeat: int, log: str) -> GateResult:
    last = runs[-1]
    metrics = merge_repetitions([run.metrics for run in runs])
    confidence = getattr(gate, "confidence", DEFAULT_CONFIDENCE)
    checks = check_thresholds(getattr(gate, "expect", None) or {}, metrics, confidence)
    targets = check_thresholds(getattr(gate, "targets", None) or {}, metrics, confidence)
    oversize = sorted(name for name, value in metrics.items() if isinstance(value, list) and len(value) > MAX_SAMPLES)
    for name in oversize:
        metrics[name] = metrics[name][:MAX_SAMPLES]
    if last.outcome != "PASS":
        outcome, reason = last.outcome, f"repetition {len(runs)} of {repeat}: {last.reason}"
    elif oversize:
        outcome, reason = "ERROR", (
            f"metric(s) {', '.join(repr(name) for name in oversize)} collected more than {MAX_SAMPLES} samples "
            f"over {repeat} repetitions (the first {MAX_SAMPLES} are kept): lower repeat or report fewer samples"
        )
    else:
        outcome, reason = threshold_verdict(checks, ran=f"exited with code 0 in each of {repeat} repetitions",
                                            hint=metrics_hint(gate, metrics, last.log_tail))
    return last.model_copy(update={
        "name": gate.name,
        "kind": gate.kind,
        "outcome": outcome,
        "reason": reason,
        "metrics": metrics,
        "checks": checks,
        "targets": targets,
        "started": runs[0].started,
        "duration_s": round(sum(run.duration_s for run in runs), 3),
        "log": log,
    })


def _append(log_path: Path, part: Path, header: str) -> None:
    """Copy a repetition's log onto the end of the gate's log, after ``header``; best effort."""
    try:
        with open(log_path, "ab") as out:
            out.write(f"{header}\n".encode())
            if part.is_file():
                with open(part, "rb") as source:
                    while chunk := source.read(1 << 20):
                        out.write(chunk)
            out.write(b"\n")
    except OSError:
        pass


def _relative(log_path: Path, report_dir: Path | None) -> str:
    base = Path(report_dir) if report_dir is not None else log_path.parent
    try:
        return Path(os.path.realpath(log_path)).relative_to(os.path.realpath(base)).as_posix()
    except ValueError:
        return log_path.name
