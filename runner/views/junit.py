"""What CI reads from a ``runner gate`` run: JUnit XML and a Markdown step summary.

JUnit: one ``testsuite`` per phase, one ``testcase`` per gate. ``FAIL`` is a ``failure`` and
``ERROR`` an ``error`` (message: the gate's reason, text: its log tail); ``BLOCKED`` and
``SKIPPED`` are ``skipped`` with the reason; the gate's metrics are the testcase's properties.
The Markdown summary (``runner/templates/summary.md.j2``) suits ``$GITHUB_STEP_SUMMARY``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from runner.formatting import MARKDOWN_FILTERS
from runner.plan.samples import metric_text
from runner.records.results import GateResult, ResultsFile, gate_confidence
from runner.templating import template_env

SUMMARY_TEMPLATE = "summary.md.j2"


def junit_xml(results: ResultsFile) -> str:
    """The results as a JUnit XML document."""
    suites = ET.Element("testsuites", name=f"runner gate {results.plan_id}")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    total_time = 0.0
    for phase in results.phases:
        counts = {
            "tests": len(phase.gates),
            "failures": sum(gate.outcome == "FAIL" for gate in phase.gates),
            "errors": sum(gate.outcome == "ERROR" for gate in phase.gates),
            "skipped": sum(gate.outcome in ("BLOCKED", "SKIPPED") for gate in phase.gates),
        }
        time = sum(gate.duration_s for gate in phase.gates)
        suite = ET.SubElement(
            suites, "testsuite", _attributes(
                name=f"{results.plan_id}/{phase.phase}", timestamp=results.created,
                hostname=results.machine.hostname, time=f"{time:.3f}", **counts,
            ),
        )
        properties = ET.SubElement(suite, "properties")
        for name, value in (
            ("run_id", results.run_id),
            ("fingerprint", results.fingerprint),
            ("machine_fingerprint", results.machine.fingerprint),
            ("gpu", results.machine.gpu_name or "none"),
            ("outcome", phase.outcome),
        ):
            ET.SubElement(properties, "property", _attributes(name=name, value=value))
        for gate in phase.gates:
            _testcase(suite, f"{results.plan_id}.{phase.phase}", gate)
        for key in totals:
            totals[key] += counts[key]
        total_time += time
    for key, value in totals.items():
        suites.set(key, str(value))
    suites.set("time", f"{total_time:.3f}")
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def _testcase(suite: ET.Element, classname: str, gate: GateResult) -> None:
    case = ET.SubElement(suite, "testcase", _attributes(classname=classname, name=gate.name,
                                                        time=f"{gate.duration_s:.3f}"))
    if gate.metrics or gate.checks or gate.targets:
        properties = ET.SubElement(case, "properties")
        pairs = [("kind", gate.kind)]
        pairs += [(name, metric_text(value, gate_confidence(gate))) for name, value in gate.metrics.items()]
        pairs += [(f"expect.{check.metric}", check.threshold) for check in gate.checks]
        for check in gate.targets:  # a target never fails the testcase; its gap is a property
            pairs += [(f"target.{check.metric}", check.threshold), (f"target_gap.{check.metric}", check.shortfall)]
        for name, value in pairs:
            ET.SubElement(properties, "property", _attributes(name=name, value=value))
    message = f"{gate.outcome}: {gate.reason}"
    if gate.outcome == "FAIL":
        ET.SubElement(case, "failure", _attributes(message=message, type=gate.outcome)).text = _details(gate)
    elif gate.outcome == "ERROR":
        ET.SubElement(case, "error", _attributes(message=message, type=gate.outcome)).text = _details(gate)
    elif gate.outcome in ("BLOCKED", "SKIPPED"):
        ET.SubElement(case, "skipped", _attributes(message=message))
    if gate.log_tail:
        ET.SubElement(case, "system-out").text = _xml_safe(gate.log_tail)


def _details(gate: GateResult) -> str:
    failed = [f"{check.metric} {check.threshold}: {check.reason}" for check in gate.checks if not check.ok]
    parts = [gate.reason, *failed]
    if gate.log_tail:
        parts += ["", "log tail:", gate.log_tail]
    return _xml_safe("\n".join(parts))


def _attributes(**values: object) -> dict[str, str]:
    """Attribute values made safe for XML 1.0 (a metric name may hold any character)."""
    return {key: _xml_safe(str(value)) for key, value in values.items()}


def _xml_safe(text: str) -> str:
    """Drop what XML 1.0 cannot hold: control characters but tab and line breaks, lone
    surrogates, U+FFFE and U+FFFF (a gate's log or a metric name may contain any)."""
    return "".join(
        ch for ch in text
        if ch in "\t\n\r" or (0x20 <= ord(ch) < 0xD800) or (0xE000 <= ord(ch) < 0xFFFE) or ord(ch) >= 0x10000
    )


def summary_markdown(results: ResultsFile) -> str:
    """A Markdown summary: each phase and gate with its outcome, and metrics vs thresholds."""
    return template_env(filters=MARKDOWN_FILTERS).get_template(SUMMARY_TEMPLATE).render(results=results)


def write_junit(path: Path, results: ResultsFile) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(junit_xml(results), encoding="utf-8")


def empty_junit_xml(plan_id: str) -> str:
    """A valid JUnit XML document with no test: what ``runner gate --completed`` writes when no
    phase is complete yet, so CI that expects the file finds one (and counts zero tests)."""
    suites = ET.Element("testsuites", name=f"runner gate {plan_id}", tests="0", failures="0", errors="0",
                        skipped="0", time="0.000")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def write_empty_junit(path: Path, plan_id: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(empty_junit_xml(plan_id), encoding="utf-8")


def append_summary(path: Path, results: ResultsFile) -> None:
    """Append the summary to ``path`` (``$GITHUB_STEP_SUMMARY`` is appended to, by convention)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(summary_markdown(results))
