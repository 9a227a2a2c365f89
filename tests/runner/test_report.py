"""Run reports: folder names, the rendered Markdown, and gate artifacts."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

from runner.gates import execute
from runner.gates.execute import run_gate
from runner.plan.schema import Plan
from runner.records.results import GateResult, PhaseResults, ResultsFile
from runner.records.run_folder import ReportContext, headline_metrics, render_report, write_report
from runner.runs import new_run_id, run_folder
from tests.runner.gate_helpers import make_gate
from tests.runner.repo_fixtures import fake_machine

FINGERPRINT = "sha256:" + "ab12cd34" + "0" * 56


def make_plan() -> Plan:
    return Plan.model_validate({
        "schema": 1,
        "id": "demo",
        "phases": [{
            "id": "alpha",
            "title": "First phase",
            "headline": ["speedup", "never_reported"],
            "gates": [
                {"name": "build", "kind": "build", "run": "true"},
                {"name": "bench", "kind": "benchmark", "run": "true", "expect": {"speedup": ">= 1.5"}},
            ],
        }],
    })


def result(name, kind, outcome="PASS", **fields) -> GateResult:
    data = {
        "name": name, "kind": kind, "outcome": outcome, "reason": "why " + name, "metrics": {},
        "checks": [], "started": "2026-11-29T23:50:00.000Z", "duration_s": 1.25, "exit_code": 0,
        "signal": None, "log": f"{name}.log", "log_tail": f"tail of {name}",
    }
    data.update(fields)
    return GateResult.model_validate(data)


def results_file(gates) -> ResultsFile:
    return ResultsFile(
        tool="t", plan_id="demo", plan_path="plans/demo.md", run_id="20261129T235000Z-ab12cd34",
        created="2026-11-29T23:50:00Z", fingerprint=FINGERPRINT, machine=fake_machine(),
        phases=[PhaseResults(phase="alpha", gates=gates)],
    )


def test_run_id_and_fresh_folders(tmp_path):
    moment = datetime(2026, 11, 29, 23, 50, 0, tzinfo=timezone.utc)
    run_id = new_run_id(FINGERPRINT, moment)
    assert run_id == "20261129T235000Z-ab12cd34"
    first = run_folder(tmp_path, "demo", "alpha", run_id)
    second = run_folder(tmp_path, "demo", "alpha", run_id)
    assert first == tmp_path / "reports" / "demo" / "alpha" / run_id
    assert second.name == f"{run_id}-2" and second.is_dir()


def test_headline_metrics_leave_out_what_was_not_reported():
    plan = make_plan()
    gates = [result("build", "build", metrics={"speedup": 1.0}),
             result("bench", "benchmark", metrics={"speedup": 2.0, "never_reported": None})]
    assert headline_metrics(plan.phases[0], gates) == {"speedup": 1.0}


def test_report_shows_gates_checks_notes_and_md_artifacts(tmp_path):
    plan = make_plan()
    bench = result(
        "bench", "benchmark", metrics={"speedup": 2.0, "ms": 0.5},
        checks=[{"metric": "speedup", "threshold": ">= 1.5", "value": 2.0, "ok": True,
                 "reason": "2.0 >= 1.5"}],
        artifacts={"bench.md": "| shape | ms |\n|---|---|\n| 64k | 0.5 |\n", "raw.csv": "a,b\n1,2\n"},
    )
    failed = result("build", "build", "FAIL", reason="exited with code 2", exit_code=2)
    results = results_file([failed, bench])
    (tmp_path / "build.log").write_text("full log\n")
    context = ReportContext(plan, plan.phases[0], "FAIL", base="c0ffee", notes=["A note | with pipe."])
    report = write_report(tmp_path, results, context)
    text = report.read_text()
    assert text.startswith("# demo / alpha: FAIL\n")
    assert "| build | build | **FAIL** | 1.2 s | exited with code 2 |" in text
    assert "> A note | with pipe." in text
    assert "`c0ffee`" in text and "testhost" in text
    assert "| speedup | `>= 1.5` | 2 | yes |" in text
    assert "Other metrics: ms=0.5" in text
    # the *.md artifact is inline under its gate; every artifact is a file next to report.md
    bench_section = text[text.index("## bench (benchmark)"):]
    assert "| 64k | 0.5 |" in bench_section
    assert "a,b" not in text
    assert (tmp_path / "artifacts" / "bench" / "bench.md").read_text().startswith("| shape |")
    assert (tmp_path / "artifacts" / "bench" / "raw.csv").read_text() == "a,b\n1,2\n"
    assert "[build.log](build.log)" in text and "[bench.log]" not in text  # only logs present
    assert "tail of build" in text
    assert "| speedup | 2 |" in text and "never_reported" not in text.split("## build")[0]
    assert json.loads((tmp_path / "results.json").read_text())["fingerprint"] == FINGERPRINT


# --- artifacts gathered by execute ----------------------------------------------------------------


def test_gate_artifacts_are_collected_and_odd_ones_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(execute, "MAX_ARTIFACT_BYTES", 100)
    script = (
        'cd "$RUNNER_ARTIFACTS"; printf "| a |\\n" > bench.md; echo note > build.txt; '
        "head -c 200 /dev/zero | tr '\\0' x > big.txt; printf '\\xff\\xfe' > binary.txt; "
        "mkdir sub; echo hi > sub/inner.txt"
    )
    log = tmp_path / "g.log"
    res = run_gate(make_gate(run=script), repo_root=tmp_path, log_path=log)
    assert res.outcome == "PASS", res.reason
    assert res.artifacts == {"bench.md": "| a |\n", "build.txt": "note\n"}
    notes = log.read_text()
    for name in ("big.txt", "binary.txt", "sub"):
        assert f"artifact '{name}' skipped" in notes
    again = GateResult.model_validate_json(res.model_dump_json())
    assert again.artifacts == res.artifacts


def test_at_most_max_artifacts_are_kept(tmp_path):
    script = 'cd "$RUNNER_ARTIFACTS"; for i in $(seq -w 1 25); do echo $i > a$i.txt; done'
    res = run_gate(make_gate(run=script), repo_root=tmp_path, log_path=tmp_path / "g.log")
    assert len(res.artifacts) == execute.MAX_ARTIFACTS == 20
    assert "more than 20 artifacts" in (tmp_path / "g.log").read_text()


def test_each_gate_gets_a_fresh_artifacts_folder(tmp_path):
    first = run_gate(make_gate(run='echo 1 > "$RUNNER_ARTIFACTS/x.txt"'), repo_root=tmp_path,
                     log_path=tmp_path / "a.log")
    second = run_gate(make_gate(run='ls "$RUNNER_ARTIFACTS"'), repo_root=tmp_path,
                      log_path=tmp_path / "b.log")
    assert first.artifacts == {"x.txt": "1\n"} and second.artifacts == {}
    assert "x.txt" not in (tmp_path / "b.log").read_text()


def _unescaped_pipes(line: str) -> int:
    return len(re.findall(r"(?<!\\)\|", line))


def test_metric_names_with_a_pipe_or_a_newline_keep_every_table_whole():
    """Headline, threshold and target tables alike: one row per metric, its name in one cell."""
    names = ["a|b", "c\nd", "e\r\n|f"]
    plan = Plan.model_validate({
        "schema": 1, "id": "demo",
        "phases": [{"id": "alpha", "headline": names, "gates": [
            {"name": "bench", "kind": "benchmark", "run": "true",
             "expect": {name: ">= 1" for name in names}, "targets": {name: ">= 5" for name in names}},
        ]}],
    })
    checks = [{"metric": name, "threshold": ">= 1", "value": 2, "ok": True, "reason": "2 >= 1"} for name in names]
    targets = [{"metric": name, "threshold": ">= 5", "value": 2, "ok": False, "reason": "2 < 5"} for name in names]
    bench = result("bench", "benchmark", metrics={**{name: 2 for name in names}, "g|h\ni": "x|y\nz"},
                   checks=checks, targets=targets)
    text = render_report(results_file([bench]), ReportContext(plan, plan.phases[0], "PASS"))
    lines = text.splitlines()
    tables: list[list[str]] = []
    for index, line in enumerate(lines):
        if line.startswith("|"):
            if index == 0 or not lines[index - 1].startswith("|"):
                tables.append([])
            tables[-1].append(line)
    for table in tables:
        assert {_unescaped_pipes(row) for row in table} == {_unescaped_pipes(table[0])}, table
    metric_rows = [row for table in tables for row in table if row.startswith(("| a\\|b |", "| c d |", "| e \\|f |"))]
    assert len(metric_rows) == 3 * 3  # headline, thresholds, targets
    assert "Other metrics: g\\|h i=x\\|y\\nz" in text
