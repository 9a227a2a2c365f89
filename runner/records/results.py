"""Gate and phase results, and the results file that carries them between machines.

Metric values are JSON numbers, strings, booleans or lists of numbers (samples). A NaN or infinite metric is kept as it
was reported: the results file writes it as the ``NaN`` / ``Infinity`` literals that Python's
``json`` module reads back, so a NaN travels as a NaN and fails its threshold again wherever
the file is re-checked (it never turns into ``null`` or ``0.0``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, StringConstraints, ValidationError, model_serializer,
                      model_validator)

from runner.atomic import write_atomic
from runner.errors import ResultsError
from runner.formatting import CONTROL_CHARS, format_metric, one_line
from runner.protocol import ARTIFACT_NAME_PATTERN, MAX_ARTIFACT_BYTES, MAX_ARTIFACTS, MAX_METRICS_BYTES
from runner.plan.samples import DEFAULT_CONFIDENCE, MAX_SAMPLES, is_samples
from runner.plan.schema import GATE_KINDS, ID_PATTERN
from runner.records.machine import MachineInfo
from runner.timeutil import iso_ms
from runner.untrusted import UntrustedFileError, parse_json, read_bounded

RESULTS_SCHEMA = 1
MAX_RESULTS_BYTES = 64 << 20
MAX_RESULTS_DEPTH = 16
_ARTIFACT_NAME = re.compile(ARTIFACT_NAME_PATTERN)
# Where a run folder keeps an artifact: artifacts/<gate>/<name>, or <gate>-<name> in older runs.
_ARTIFACT_FILE = re.compile(rf"(?:artifacts/{ID_PATTERN.strip('^$')}/)?{ARTIFACT_NAME_PATTERN}")

Outcome = Literal["PASS", "FAIL", "ERROR", "BLOCKED", "SKIPPED"]
Samples = list[int | float]
"""A metric reported as a list of numbers (``runner.plan.samples``)."""
MetricValue = bool | int | float | str | None | Samples

_MODEL_CONFIG = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


RUN_ID_PATTERN = r"^\d{8}T\d{6}Z-[0-9a-f]{8}$"
FINGERPRINT_PATTERN = r"^sha256:[0-9a-f]{64}$"
_UTC_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,6})?Z")


def _utc_time(value: str) -> str:
    """``2026-11-29T23:50:00Z`` (milliseconds allowed) that is a real moment."""
    try:
        if _UTC_TIME.fullmatch(value):
            datetime.fromisoformat(value.replace("Z", "+00:00"))
            return value
    except ValueError:
        pass
    raise ValueError(f"expected a UTC time like 2026-11-29T23:50:00Z, got {value[:40]!r}")


def _plain_text(value: str) -> str:
    if CONTROL_CHARS.search(value):
        raise ValueError(f"holds a control character (a line break or a terminal escape): {one_line(value)[:60]}")
    return value


UtcTime = Annotated[str, AfterValidator(_utc_time)]
PlainText = Annotated[str, AfterValidator(_plain_text)]


class MetricCheck(BaseModel):
    """One ``expect`` (or ``targets``) entry checked against the reported metrics.

    ``threshold`` is the threshold's text (``">= 1.5"``); ``value`` is what the gate reported
    (``None`` when it reported nothing); ``reason`` says why the check failed, or restates the
    comparison when it held; ``gap`` is how far the value is from the threshold (0 when met,
    ``None`` when no distance says it: see ``Threshold.gap``).

    For a metric reported as samples, ``value`` is their median, ``samples`` how many there
    were, ``interval`` the ``[low, high]`` interval of the median at ``confidence`` on which
    the threshold was judged (``None`` when there were too few samples for one).
    """

    model_config = _MODEL_CONFIG

    metric: str
    threshold: str
    value: bool | int | float | str | None
    ok: bool
    reason: str
    gap: float | None = None
    samples: int | None = None
    interval: list[float] | None = None
    confidence: float | None = None

    @property
    def value_text(self) -> str:
        """The value as a report shows it: ``2.31``, or for samples ``2.31 (median of 20; 95%
        interval [2.1, 2.5])``."""
        text = format_metric(self.value)
        if self.samples is None:
            return text
        where = (f"; {self.confidence * 100:g}% interval [{format_metric(self.interval[0])}, "
                 f"{format_metric(self.interval[1])}]") if self.interval and self.confidence else ""
        return f"{text} (median of {self.samples}{where})"

    @property
    def shortfall(self) -> str:
        """``met``, ``0.17 short`` or ``not met``: how a view says where a value stands."""
        if self.ok:
            return "met"
        return f"{format_metric(self.gap)} short" if self.gap is not None else "not met"


class GateResult(BaseModel):
    """What one gate did.

    ``started`` is an ISO 8601 UTC time; ``exit_code`` is the process's exit status and
    ``signal`` the name of the signal that ended it (both ``None`` when no process ran);
    ``log`` is the log's path relative to the report directory (``None`` when no process
    ran) and ``log_tail`` the last lines of that log. ``artifacts`` maps the names of the
    small text files the gate wrote to ``$RUNNER_ARTIFACTS`` to their contents; in a run folder
    the text is in files next to ``results.json`` instead, named in ``artifact_files``
    (``runner.records.run_folder.read_artifacts`` reads both). ``checks`` are
    the gate's ``expect`` thresholds, which decide its outcome; ``targets`` its ``targets``,
    which never do (a missed target is shown with its gap, nothing more).
    """

    model_config = _MODEL_CONFIG

    name: Annotated[str, StringConstraints(pattern=ID_PATTERN)]
    kind: str
    outcome: Outcome
    reason: str
    metrics: dict[str, MetricValue]
    checks: list[MetricCheck]
    started: UtcTime
    duration_s: float
    exit_code: int | None
    signal: str | None
    log: str | None
    log_tail: str
    artifacts: dict[str, str] = {}
    artifact_files: dict[str, str] = {}
    targets: list[MetricCheck] = []

    @classmethod
    def not_run(cls, gate: object, outcome: Outcome, reason: str) -> GateResult:
        """A result with no process behind it (``BLOCKED``, ``SKIPPED``, or an ``ERROR`` before
        start); ``gate`` is anything with ``name`` and ``kind``."""
        return cls(
            name=gate.name,
            kind=gate.kind,
            outcome=outcome,
            reason=reason,
            metrics={},
            checks=[],
            started=iso_ms(),
            duration_s=0.0,
            exit_code=None,
            signal=None,
            log=None,
            log_tail="",
        )


GateName = Annotated[str, StringConstraints(pattern=ID_PATTERN)]


class Coverage(BaseModel):
    """Which of its phase's gates a results file holds, when it is not all of them.

    ``covered``: the gates whose results the file holds (its ``gates``, in run order);
    ``not_covered``: the phase's other gates, which another results file must hold before the
    phase can be checkpointed (``runner advance --results A --results B``); ``only``: the gates
    ``runner gate --only`` selected (``None``: all of them); ``finished``: ``False`` in the file
    ``runner gate --out`` writes after each gate, before its run ends, which is what a job
    ended at its time limit (or killed) leaves behind.
    """

    model_config = _MODEL_CONFIG

    covered: list[GateName]
    not_covered: list[GateName]
    only: list[GateName] | None = None
    finished: bool = True


class ResultsSource(BaseModel):
    """One of the results files a phase's record was combined from: the file's name, its run,
    the machine it ran on and the gates taken from it (``runner.records.combine``)."""

    model_config = _MODEL_CONFIG

    file: PlainText
    run_id: Annotated[str, StringConstraints(pattern=RUN_ID_PATTERN)]
    created: UtcTime
    machine: MachineInfo
    gates: list[GateName]


class PhaseResults(BaseModel):
    """The gates of one phase in the order they ran; ``outcome`` follows from them.

    ``outcome`` may be omitted (it is derived with ``combine_outcomes``); when given it must
    equal the derived value, so a hand-edited results file cannot claim a pass.
    ``definitions`` are the phase's gates as the run saw them in the plan
    (``runner.records.binding``; ``None`` in files written before they were recorded).
    ``coverage`` says which gates the results hold when not all (``None``: every gate of the
    phase); ``sources`` names the results files a record was combined from (``None``: one run).
    Both are left out of the file when ``None``, so a whole run's file reads as it always did.
    """

    model_config = _MODEL_CONFIG

    phase: str
    outcome: Outcome = "PASS"
    gates: list[GateResult]
    definitions: dict[str, dict[str, Any]] | None = None
    coverage: Coverage | None = None
    sources: list[ResultsSource] | None = None

    @model_serializer(mode="wrap")
    def _leave_out_unset(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        for key in ("coverage", "sources"):
            if data.get(key) is None:
                data.pop(key, None)
        return data

    def machine_of(self, gate: str, default: MachineInfo) -> MachineInfo:
        """The machine ``gate`` ran on: its source's, for a record combined from several files."""
        for source in self.sources or []:
            if gate in source.gates:
                return source.machine
        return default

    @model_validator(mode="after")
    def _derive_outcome(self) -> PhaseResults:
        derived = combine_outcomes(gate.outcome for gate in self.gates)
        if "outcome" in self.model_fields_set and self.outcome != derived:
            raise ValueError(
                f"phase {self.phase!r}: outcome {self.outcome} does not follow from its gates "
                f"(they give {derived})"
            )
        self.outcome = derived
        return self


class ResultsFile(BaseModel):
    """A run's results, bound to the tree fingerprint and the machine they were measured on.

    The fields the views print and the run's folder is named after are held to the forms the
    runner writes (a run id ``20261129T235000Z-1a2b3c4d``, a UTC time, a ``sha256:`` fingerprint,
    no control characters), so a file written by hand cannot crash a view or reach a terminal
    with an escape sequence.
    """

    model_config = _MODEL_CONFIG

    results_schema: int = RESULTS_SCHEMA
    tool: PlainText
    plan_id: Annotated[str, StringConstraints(pattern=ID_PATTERN)]
    plan_path: PlainText
    run_id: Annotated[str, StringConstraints(pattern=RUN_ID_PATTERN)]
    created: UtcTime
    fingerprint: Annotated[str, StringConstraints(pattern=FINGERPRINT_PATTERN)]
    machine: MachineInfo
    phases: list[PhaseResults]

    def phase(self, phase_id: str) -> PhaseResults:
        """The results of phase ``phase_id``; ``ValueError`` when the file holds none."""
        for phase_results in self.phases:
            if phase_results.phase == phase_id:
                return phase_results
        raise ValueError(f"results hold no phase {phase_id!r}")

    def dump(self, path: Path) -> None:
        """Write the file as indented JSON, atomically (temp file in the same folder, rename)."""
        text = json.dumps(self.model_dump(mode="python"), indent=2, allow_nan=True) + "\n"
        write_atomic(Path(path), text, make_parents=True)

    @classmethod
    def load(cls, path: Path) -> ResultsFile:
        """Read a results file; raise ``ResultsError`` naming the file and what is wrong."""
        path = Path(path)
        try:
            raw = read_bounded(path, MAX_RESULTS_BYTES, what="the results file")
            if raw is None:
                raise ResultsError(f"{path}: cannot read the results file: no such file")
            data = parse_json(raw, what="the results file", max_depth=MAX_RESULTS_DEPTH, unique_keys=True)
        except UntrustedFileError as exc:
            raise ResultsError(f"{path}: {exc}") from None
        if not isinstance(data, dict):
            raise ResultsError(
                f"{path}: a results file is a JSON object, got {type(data).__name__}"
            )
        schema = data.get("results_schema")
        if schema != RESULTS_SCHEMA:
            raise ResultsError(
                f"{path}: unknown results_schema {schema!r}; this runner reads "
                f"results_schema {RESULTS_SCHEMA} (use the runner version that wrote the file)"
            )
        try:
            results = cls.model_validate(data, strict=True)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in err['loc']) or '<top>'}: {err['msg']}"
                for err in exc.errors(include_url=False)[:10]
            )
            raise ResultsError(f"{path}: invalid results file: {problems}") from None
        problems = consistency_problems(results)
        if problems:
            raise ResultsError(f"{path}: inconsistent results file: " + "; ".join(problems[:10]))
        return results


def consistency_problems(results: ResultsFile) -> list[str]:
    """What makes ``results`` impossible for a runner to have written: a phase or gate that
    appears twice, an unknown gate kind, a PASS whose process did not exit 0 or whose checks
    failed, an outcome with a signal but no FAIL/ERROR, a BLOCKED or SKIPPED gate with a
    process, artifacts or metrics over the limits a local run keeps to. (Thresholds are re-checked against the metrics by the caller.)"""
    problems: list[str] = []
    phases = [phase.phase for phase in results.phases]
    problems += [f"phase {name!r} appears {phases.count(name)} times" for name in sorted(set(phases))
                 if phases.count(name) > 1]
    for phase in results.phases:
        names = [gate.name for gate in phase.gates]
        problems += [f"phase {phase.phase!r}: gate {name!r} appears {names.count(name)} times"
                     for name in sorted(set(names)) if names.count(name) > 1]
        problems += coverage_problems(phase)
        for gate in phase.gates:
            where = f"phase {phase.phase!r} gate {gate.name!r}"
            if gate.kind not in GATE_KINDS:
                problems.append(f"{where}: unknown kind {gate.kind!r}")
            if gate.outcome == "PASS":
                if gate.exit_code != 0 or gate.signal is not None:
                    problems.append(f"{where}: PASS but exit code {gate.exit_code} and signal {gate.signal}")
                if any(not check.ok for check in gate.checks):
                    problems.append(f"{where}: PASS with a failed check")
            if gate.outcome in ("BLOCKED", "SKIPPED") and (gate.exit_code is not None or gate.signal is not None):
                problems.append(f"{where}: {gate.outcome} but a process ran (exit code or signal recorded)")
            if gate.exit_code is not None and gate.signal is not None:
                problems.append(f"{where}: both an exit code and a signal")
            problems += [f"{where}: {problem}" for problem in _artifact_problems(gate)]
            problems += [f"{where}: metric {name[:60]!r} holds {len(value)} samples, more than {MAX_SAMPLES}"
                         for name, value in gate.metrics.items() if is_samples(value) and len(value) > MAX_SAMPLES][:3]
            size = metrics_text_bytes(gate.metrics)
            if size > MAX_METRICS_BYTES:
                problems.append(f"{where}: its metric names and string values hold {size} bytes, more than the "
                                f"{MAX_METRICS_BYTES}-byte metrics file a gate may write (a long string metric?)")
    return problems


def coverage_problems(phase: PhaseResults) -> list[str]:
    """How ``phase.coverage`` disagrees with the gates the phase's results hold, and ``sources``
    name gates it does not hold or a gate twice."""
    problems: list[str] = []
    where = f"phase {phase.phase!r}"
    names = [gate.name for gate in phase.gates]
    coverage = phase.coverage
    if coverage is not None:
        if coverage.covered != names:
            problems.append(f"{where}: coverage.covered lists {', '.join(coverage.covered) or 'no gate'}, but the "
                            f"file holds {', '.join(names) or 'no gate'}")
        both = sorted(set(coverage.covered) & set(coverage.not_covered))
        if both:
            problems.append(f"{where}: gate(s) {', '.join(both)} both covered and not covered")
        twice = sorted({name for name in coverage.not_covered if coverage.not_covered.count(name) > 1})
        if twice:
            problems.append(f"{where}: coverage.not_covered lists {', '.join(twice)} more than once")
        if coverage.only is not None and set(coverage.covered) - set(coverage.only):
            problems.append(f"{where}: covers gate(s) {', '.join(sorted(set(coverage.covered) - set(coverage.only)))} "
                            "that --only did not select")
    taken = [name for source in phase.sources or [] for name in source.gates]
    if set(taken) - set(names):
        problems.append(f"{where}: sources name gate(s) {', '.join(sorted(set(taken) - set(names)))} it does not hold")
    if len(taken) != len(set(taken)):
        problems.append(f"{where}: sources name a gate more than once")
    return problems


def metrics_text_bytes(metrics: Mapping[str, MetricValue]) -> int:
    """The UTF-8 bytes of the metrics' names and string values: a lower bound of the size of any
    JSON file that holds them (an escape only lengthens a character), so a local run, which
    reads at most ``MAX_METRICS_BYTES`` of a gate's metrics file, never records more."""
    return sum(
        len(name.encode("utf-8", "surrogatepass"))
        + (len(value.encode("utf-8", "surrogatepass")) if isinstance(value, str) else 0)
        for name, value in metrics.items()
    )


def _artifact_problems(gate: GateResult) -> list[str]:
    """Artifacts no gate run by the runner could have left: more than ``MAX_ARTIFACTS``, over
    ``MAX_ARTIFACT_BYTES``, or names that are not plain (the same limits as a local run)."""
    problems = []
    names = [*gate.artifacts, *gate.artifact_files]
    if len(names) > MAX_ARTIFACTS:
        problems.append(f"{len(names)} artifacts, over the limit of {MAX_ARTIFACTS}")
    problems += [f"artifact name {name[:60]!r} is not letters, digits and ._-" for name in names
                 if not _ARTIFACT_NAME.fullmatch(name)][:3]
    problems += [f"artifact file {file_name[:60]!r} is not a plain file name or artifacts/<gate>/<name>"
                 for file_name in gate.artifact_files.values() if not _ARTIFACT_FILE.fullmatch(file_name)][:3]
    too_big = [name for name, text in gate.artifacts.items() if len(text.encode("utf-8", "surrogatepass")) > MAX_ARTIFACT_BYTES]
    problems += [f"artifact {name[:60]!r} is over the {MAX_ARTIFACT_BYTES}-byte limit" for name in too_big[:3]]
    return problems


def plan_problems(gates: Iterable[GateResult], planned: Iterable[object]) -> list[str]:
    """How recorded ``gates`` differ from the phase's ``planned`` gates (anything with ``name``
    and ``kind``, in the order a run executes them: ``planning.ordered_gates``), apart from
    missing ones (reported by the caller): a gate the plan does not have, a gate recorded with
    another kind than the plan gives it, or gates in another order than a run takes."""
    plan = {getattr(gate, "name"): getattr(gate, "kind") for gate in planned}
    problems = []
    recorded = list(gates)
    for gate in recorded:
        if gate.name not in plan:
            problems.append(f"gate {gate.name!r} is not a gate of this phase in the plan")
        elif gate.kind != plan[gate.name]:
            problems.append(f"gate {gate.name!r} is recorded as {gate.kind}, the plan says {plan[gate.name]}")
    order = [gate.name for gate in recorded if gate.name in plan]
    expected = [name for name in plan if name in order]
    if order != expected:
        problems.append(f"gates recorded in the order {', '.join(order)}, not the order a run of the plan takes: {', '.join(expected)}")
    return problems


def gate_confidence(gate: GateResult) -> float:
    """The confidence a gate's checks were judged at (the default for a gate without any): what
    a view shows a sampled metric's interval at when it has the result and not the plan."""
    return next((check.confidence for check in [*gate.checks, *gate.targets] if check.confidence is not None),
                DEFAULT_CONFIDENCE)


def combine_outcomes(outcomes: Iterable[Outcome]) -> Outcome:
    """Outcome of a group of gates: FAIL > ERROR > BLOCKED > PASS.

    An empty group passes; a group in which every gate was skipped is ``SKIPPED`` (nothing
    ran, so nothing passed).
    """
    seen = set(outcomes)
    for outcome in ("FAIL", "ERROR", "BLOCKED"):
        if outcome in seen:
            return outcome
    if seen == {"SKIPPED"}:
        return "SKIPPED"
    return "PASS"
