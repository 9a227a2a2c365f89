"""Turn what a gate process did (exit status, status file, metrics file) into its outcome.

Targets (``targets:``) are checked like thresholds and recorded, but never enter the verdict.
A metric may be a list of numbers (samples); its thresholds are judged at the gate's
``confidence`` (``runner.plan.samples``).

Precedence: a timeout, then a callable that could not be loaded (ERROR) or raised (FAIL), then
a signal, then a non-zero exit, then a callable whose child exited 0 without its status line
(ERROR: the function never ran), then unreadable metrics (ERROR), then thresholds. A SIGKILL the
runner did not send is reported as ``killed by SIGKILL (out of memory?)``: the runner sends it
only after a timeout or an interrupt, so the kernel's out-of-memory killer is the usual sender.

A shell gate that wrote no metrics but printed a JSON object on its output, and fails because a
metric was not reported, is told where metrics go (``METRICS_HINT``): printing them is the usual
first mistake.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.gates import call as callgate
from runner.gates import output as gateoutput
from runner.protocol import METRICS_ENV, GateFiles
from runner.plan.samples import DEFAULT_CONFIDENCE, MAX_SAMPLES
from runner.records.checks import check_thresholds
from runner.records.results import MetricCheck


METRICS_HINT = (f"gate printed JSON on stdout; a shell gate writes its metrics to the file named by ${METRICS_ENV} "
                f"(printf '{{\"x\": 1}}' > \"${METRICS_ENV}\")")
_HINT_LINE_CHARS = 4096  # longer output lines are not parsed for the hint


@dataclass(frozen=True)
class Verdict:
    """A gate's outcome with its reason, and the fields of its ``GateResult`` that follow
    from what the process left behind."""

    outcome: str
    reason: str
    metrics: dict[str, Any] = field(default_factory=dict)
    checks: list[MetricCheck] = field(default_factory=list)
    targets: list[MetricCheck] = field(default_factory=list)
    exit_code: int | None = None
    signal: str | None = None


def judge(gate: Any, returncode: int, timed_out: bool, timeout: float | None, files: GateFiles,
          output: str = "") -> Verdict:
    """The verdict on a finished gate process (see the module docstring for the precedence);
    ``output``: the end of what it printed (its log's tail), for ``METRICS_HINT``."""
    exit_code = returncode if returncode >= 0 else None
    sig_name = _signal_name(-returncode) if returncode < 0 else None
    metrics, metrics_problem = _read_metrics(files.metrics)
    expect = getattr(gate, "expect", None) or {}
    confidence = getattr(gate, "confidence", DEFAULT_CONFIDENCE)
    checks = check_thresholds(expect, metrics, confidence) if metrics_problem is None else []
    targets = (check_thresholds(getattr(gate, "targets", None) or {}, metrics, confidence)
               if metrics_problem is None else [])
    fields = {"metrics": metrics, "checks": checks, "targets": targets, "exit_code": exit_code,
              "signal": sig_name}
    status = (
        gateoutput.read_status(files.status, callgate.EXIT_CODES) if getattr(gate, "call", None) else None
    )

    if timed_out:
        return Verdict("FAIL", f"timed out after {timeout:g} s", **fields)
    if status is not None and status[0] == callgate.STATUS_NOT_LOADED:
        return Verdict("ERROR", status[1], **fields)
    if status is not None and status[0] in (callgate.STATUS_RAISED, callgate.STATUS_BAD_RETURN):
        return Verdict("FAIL", status[1], **fields)
    if sig_name is not None:
        return Verdict("FAIL", f"killed by {_maybe_oom(sig_name)}", **fields)
    if returncode != 0:
        return Verdict("FAIL", _exit_reason(gate, returncode), **fields)
    if getattr(gate, "call", None) and status is None:
        return Verdict(
            "ERROR",
            "the callable's process exited with code 0 without reporting that the function ran: "
            "something ended the process first (os._exit or sys.exit while its module was imported?)",
            **fields,
        )
    if metrics_problem is not None:
        return Verdict("ERROR", metrics_problem, **fields)
    outcome, reason = threshold_verdict(checks, hint=metrics_hint(gate, metrics, output))
    return Verdict(outcome, reason, **fields)


def threshold_verdict(checks: list[MetricCheck], ran: str = "exited with code 0", hint: str = "") -> tuple[str, str]:
    """``FAIL`` with the failed checks' reasons (then ``hint`` when a metric was not reported), or
    ``PASS`` saying what ``ran`` and how many thresholds held: the verdict on a gate whose
    process(es) exited 0."""
    failed = [check for check in checks if not check.ok]
    if failed:
        reason = "; ".join(_check_reason(check) for check in failed)
        if hint and any(check.value is None and check.reason == "not reported" for check in failed):
            reason += f"; {hint}"
        return "FAIL", reason
    return "PASS", f"{ran}; {len(checks)} threshold(s) met" if checks else ran


def metrics_hint(gate: Any, metrics: dict[str, Any], output: str) -> str:
    """``METRICS_HINT`` for a shell gate that reported no metric and printed a line that is a
    JSON object; ``""`` otherwise."""
    if not getattr(gate, "run", None) or metrics:
        return ""
    for line in output.splitlines():
        line = line.strip()
        if not (line.startswith("{") and line.endswith("}")) or len(line) > _HINT_LINE_CHARS:
            continue
        try:
            printed = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(printed, dict) and printed:
            return METRICS_HINT
    return ""


def _read_metrics(path: Path) -> tuple[dict[str, Any], str | None]:
    """The metrics a gate reported (``{}`` when it wrote none) and a problem, if any."""
    data, problem = gateoutput.read_json(path, what="metrics file")
    if problem is not None or data is None:
        return {}, problem
    if not isinstance(data, dict):
        return {}, f"metrics file holds a JSON {type(data).__name__}, not an object"
    bad = [key for key, value in data.items() if not _is_metric(value)]
    if bad:
        return {}, (
            f"metric(s) {', '.join(repr(k) for k in bad)} are not numbers, strings, booleans or "
            f"lists of at most {MAX_SAMPLES} numbers (samples)"
        )
    return data, None


def _is_metric(value: object) -> bool:
    if isinstance(value, list):
        return len(value) <= MAX_SAMPLES and all(
            isinstance(item, (int, float)) and not isinstance(item, bool) for item in value
        )
    return value is None or isinstance(value, (bool, int, float, str))


def _check_reason(check: MetricCheck) -> str:
    return f"{check.metric}: {check.reason}"


def _exit_reason(gate: Any, returncode: int) -> str:
    reason = f"exited with code {returncode}"
    if getattr(gate, "run", None) and returncode > 128:
        name = _signal_name(returncode - 128)
        if name is not None:
            reason += f" (the shell reports a command killed by {_maybe_oom(name)})"
    return reason


def _maybe_oom(sig_name: str) -> str:
    """``SIGKILL (out of memory?)`` for SIGKILL: the runner only sends it after a timeout or
    an interrupt (handled before), so the kernel's OOM killer is the likely sender."""
    return f"{sig_name} (out of memory?)" if sig_name == "SIGKILL" else sig_name


def _signal_name(number: int) -> str | None:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
