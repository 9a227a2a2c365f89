"""The evidence of a run: ``reports/<plan>/<phase>/<run-id>/``.

A run's folder holds ``results.json`` (the ``ResultsFile`` of the run), ``report.md`` (rendered
from ``runner/templates/report.md.j2``), ``run.json`` (``RunMeta``: what the run was for and
whether the plan records its outcome), the gate logs the run wrote there (``<gate>.log``) and
the gates' artifacts (``artifacts/<gate>/<name>``). ``report.md`` shows every ``*.md`` artifact
inline under its gate, so the benchmark table and the build summary read in place.

Decisions:

- Artifacts live in a folder per gate under ``artifacts/``, so no two gates' files can share a
  name: with gates ``g``, ``g-x`` and ``g-a``, ``g``'s ``x.log`` and ``a-notes.md`` once were
  ``g-x.log`` (``g-x``'s log) and ``g-a-notes.md`` (``g-a``'s ``notes.md``). A log ends in
  ``.log`` and sits beside ``artifacts/``; the run's own files (``results.json``,
  ``report.md``, ``run.json``) end otherwise, so no gate id can reach them either.
- An artifact's file is named exactly as the gate named it (a name of letters, digits and
  ``._-`` that starts with a letter or digit, ``ARTIFACT_NAME_PATTERN``), and the gate's folder
  by the gate's id (``safe_name(id) == id``): cutting a last ``.`` or ``-`` off, as
  ``safe_name`` does, once gave ``notes.md``, ``notes.md.`` and ``notes.md-`` one file.
- Runs written before keep their ``<gate>-<name>`` files: ``results.json`` names each
  artifact's file (``artifact_files``), and readers follow that name.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from runner.formatting import MARKDOWN_FILTERS, one_line, table_cell
from runner.protocol import ARTIFACT_NAME_PATTERN, MAX_ARTIFACT_BYTES
from runner.plan.samples import DEFAULT_CONFIDENCE, metric_text
from runner.plan.schema import Phase, Plan
from runner.records.checks import check_thresholds
from runner.records.machine import MachineInfo
from runner.records.results import GateResult, MetricCheck, ResultsFile, gate_confidence
from runner.templating import template_env
from runner.untrusted import UntrustedFileError, parse_json, read_bounded

REPORTS_DIR = "reports"
"""Where runs are kept, relative to the root: ``reports/<plan>/<phase>/<run-id>/``."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_ARTIFACT_NAME = re.compile(ARTIFACT_NAME_PATTERN)


def safe_name(text: str) -> str:
    """``text`` reduced to letters, digits and ``._-`` (for folder and file names)."""
    return _UNSAFE.sub("-", text).strip("-.") or "x"

TEMPLATE = "report.md.j2"
RESULTS = "results.json"
RUN_META = "run.json"
ROLES = ("run", "evidence")


@dataclass(frozen=True)
class RunMeta:
    """What a run was for, kept next to its results (``run.json``).

    ``role``: ``run`` (a run of the phase that is next, whose outcome the plan may record) or
    ``evidence`` (a run of a phase that waits on an earlier one; never changes the plan).
    ``recorded``: whether the plan's status was set from this run; a run that could only block
    on a phase that already holds an earlier run's verdict leaves the plan alone.
    ``reason``: why (``waiting on `kernel```, ``the plan keeps failed from run ...``).
    """

    role: str = "run"
    recorded: bool = True
    reason: str = ""

    @property
    def evidence(self) -> bool:
        return self.role == "evidence"


def read_run_meta(run_dir: Path) -> RunMeta:
    """The run's ``run.json``; runs written before it existed (or a damaged one, a FIFO, a
    huge file) read as a recorded ``run``."""
    try:
        raw = read_bounded(Path(run_dir) / RUN_META, 65536, what=RUN_META)
        data = parse_json(raw, what=RUN_META) if raw is not None else None
    except UntrustedFileError:
        return RunMeta()
    if not isinstance(data, dict):
        return RunMeta()
    role = data.get("role") if data.get("role") in ROLES else "run"
    recorded = data.get("recorded") if isinstance(data.get("recorded"), bool) else role == "run"
    reason = data.get("reason") if isinstance(data.get("reason"), str) else ""
    return RunMeta(role, recorded and role == "run", one_line(reason[:500]))


@dataclass(frozen=True)
class ReportContext:
    """What a report says beyond the results themselves.

    ``outcome`` is the run's verdict (it can be ``FAIL`` although every gate passed, when the
    tree changed under them); ``notes`` are sentences shown at the top; ``source`` says where
    the results came from; ``base`` is the commit the gates ran on (``None`` outside git).
    """

    plan: Plan
    phase: Phase
    outcome: str
    base: str | None = None
    source: str = "local run"
    notes: list[str] = field(default_factory=list)
    meta: RunMeta = field(default_factory=RunMeta)


ARTIFACTS_DIR = "artifacts"


def artifact_file_name(gate: str, name: str) -> str:
    """Where the run folder keeps artifact ``name`` of ``gate``, relative to it (POSIX): the
    name itself, which the gate's side and an import both keep to ``ARTIFACT_NAME_PATTERN``
    (``safe_name`` only for what could not come from either)."""
    kept = name if _ARTIFACT_NAME.fullmatch(name) else safe_name(name)
    return f"{ARTIFACTS_DIR}/{safe_name(gate)}/{kept}"


def write_report(run_dir: Path, results: ResultsFile, context: ReportContext) -> Path:
    """Write ``results.json``, the artifacts and ``report.md`` into ``run_dir``; return the
    path of ``report.md``.

    The artifacts' text goes to their own files (``artifact_file_name``); ``results.json``
    names them in ``artifact_files`` instead of repeating the text, so the views that read
    every run (``status``, ``history``) never read an artifact. A run the plan does not record
    (``RunMeta.recorded`` false, not evidence) is ignored by git (``hide_from_git``).
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for phase_results in results.phases:
        for gate in phase_results.gates:
            for name, text in gate.artifacts.items():
                path = run_dir / artifact_file_name(gate.name, name)
                path.parent.mkdir(parents=True, exist_ok=True)
                _write_text(path, text)
    _stored(results).dump(run_dir / RESULTS)
    _write_text(run_dir / RUN_META, json.dumps(asdict(context.meta), indent=2) + "\n")
    if not context.meta.recorded and not context.meta.evidence:
        hide_from_git(run_dir)
    report = run_dir / "report.md"
    _write_text(report, render_report(results, context, run_dir=run_dir))
    return report


def mark_unrecorded(run_dir: Path, reason: str) -> None:
    """After the fact: the plan does not record the run in ``run_dir`` (its checkpoint was
    refused), so ``run.json`` says why and git ignores the folder. Best effort."""
    try:
        _write_text(Path(run_dir) / RUN_META, json.dumps(asdict(RunMeta(recorded=False, reason=reason[:500])),
                                                          indent=2) + "\n")
        hide_from_git(Path(run_dir))
    except OSError:
        pass


def hide_from_git(folder: Path) -> None:
    """A ``.gitignore`` holding ``*`` in ``folder``: git ignores the folder and the file itself
    (what pytest does with its cache), so a run kept only on this machine leaves ``git status``
    clean; ``git add -f`` still adds it."""
    _write_text(Path(folder) / ".gitignore", "# A run the plan does not record: kept here, ignored by git.\n*\n")


def read_artifacts(run_dir: Path, gate: GateResult) -> dict[str, str]:
    """The gate's artifacts by name: held in the results (a results file, a run written before
    artifacts moved to their own files), else read back from their files in ``run_dir`` (each
    bounded, a regular file, UTF-8; one that is not is left out)."""
    if gate.artifacts or not gate.artifact_files:
        return dict(gate.artifacts)
    found = {}
    for name, file_name in gate.artifact_files.items():
        try:
            data = read_bounded(Path(run_dir) / file_name, MAX_ARTIFACT_BYTES, what="artifact")
            if data is not None:
                found[name] = data.decode("utf-8")
        except (UntrustedFileError, UnicodeDecodeError):
            continue
    return found


def _stored(results: ResultsFile) -> ResultsFile:
    """``results`` as a run folder keeps them: each artifact named by its file, not repeated."""
    phases = []
    for phase_results in results.phases:
        gates = [
            gate.model_copy(update={
                "artifacts": {},
                "artifact_files": {name: artifact_file_name(gate.name, name) for name in gate.artifacts},
            }) if gate.artifacts else gate
            for gate in phase_results.gates
        ]
        phases.append(phase_results.model_copy(update={"gates": gates}))
    return results.model_copy(update={"phases": phases})


def render_report(results: ResultsFile, context: ReportContext, *, run_dir: Path | None = None) -> str:
    """The Markdown report of ``results`` for ``context.phase``."""
    phase_results = results.phase(context.phase.id)
    gates = [_gate_view(gate, run_dir) for gate in phase_results.gates]
    env = template_env(filters=MARKDOWN_FILTERS)
    text = env.get_template(TEMPLATE).render(
        plan=context.plan,
        phase=context.phase,
        outcome=context.outcome,
        meta=context.meta,
        base=context.base,
        source=context.source,
        notes=context.notes,
        results=results,
        machine=results.machine,
        machine_fingerprint=results.machine.fingerprint,
        gates=gates,
        headline=headline_texts(context.phase, headline_metrics(context.phase, phase_results.gates)),
        sources=phase_results.sources or [],
        ran_on={gate.name: _where(source.machine) + f" ({source.file})"
                for source in phase_results.sources or [] for gate in phase_results.gates if gate.name in source.gates},
    )
    return text.rstrip("\n") + "\n"


def _where(machine: MachineInfo) -> str:
    """``host: GPU`` (``x2`` for two): the machine as a report names it."""
    gpu = (machine.gpu_name or "no GPU") + (f" x{machine.gpu_count}" if machine.gpu_count > 1 else "")
    return f"{machine.hostname}: {gpu}"


def headline_metrics(phase: Phase, gates: list[GateResult]) -> dict[str, bool | int | float | str]:
    """The phase's headline metrics as reported by its gates (first gate reporting wins).

    A metric no gate reported is left out: it is never recorded as 0.
    """
    found: dict[str, bool | int | float | str] = {}
    for name in phase.headline_metrics():
        for gate in gates:
            value = gate.metrics.get(name)
            if value is not None:
                found[name] = value
                break
    return found


def metric_confidence(phase: Phase, metric: str) -> float:
    """The confidence a view shows ``metric``'s interval at: that of the first gate of the
    phase that names it in ``expect``, ``targets`` or ``tolerance``, else the default."""
    for gate in phase.gates:
        if metric in gate.expect or metric in gate.targets or metric in gate.tolerance:
            return gate.confidence
    return DEFAULT_CONFIDENCE


def headline_texts(phase: Phase, metrics: dict) -> dict[str, str]:
    """``metrics`` of ``phase`` as text, samples as their median and interval (``metric_text``)."""
    return {name: metric_text(value, metric_confidence(phase, name)) for name, value in metrics.items()}


def target_checks(phase: Phase, gates: list[GateResult]) -> list[MetricCheck]:
    """The phase's targets as the plan states them now, checked against what its gates
    measured (a run older than a target is still measured against it); gates that did not run
    (blocked, skipped, absent) are left out: nothing was measured."""
    ran = {gate.name: gate for gate in gates if gate.outcome not in ("BLOCKED", "SKIPPED")}
    return [
        check
        for spec in phase.gates if spec.targets and spec.name in ran
        for check in check_thresholds(spec.targets, ran[spec.name].metrics, spec.confidence)
    ]


@dataclass(frozen=True)
class _GateView:
    result: GateResult
    log_link: str | None
    inline: list[tuple[str, str]]  # (name, markdown) of *.md artifacts
    links: str  # Markdown links to every artifact's file next to report.md
    other_metrics: str  # metrics that no threshold checks, "name=value, ..."


def _gate_view(gate: GateResult, run_dir: Path | None) -> _GateView:
    log_link = None
    if gate.log and run_dir is not None and (run_dir / gate.log).is_file():
        log_link = gate.log
    inline = [(name, text.strip("\n")) for name, text in sorted(gate.artifacts.items()) if name.endswith(".md")]
    links = ", ".join(f"[{name}]({artifact_file_name(gate.name, name)})" for name in sorted(gate.artifacts))
    checked = {check.metric for check in gate.checks}
    other = ", ".join(
        f"{table_cell(name)}={table_cell(metric_text(value, gate_confidence(gate)))}"
        for name, value in sorted(gate.metrics.items())
        if name not in checked
    )
    return _GateView(gate, log_link, inline, links, other)


def _write_text(path: Path, text: str) -> None:
    path.write_bytes(text.encode("utf-8"))
