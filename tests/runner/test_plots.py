"""Plots drawn from the declared ``runner.plot/1`` artifact format, defensively."""

from __future__ import annotations

import copy
import json
import re

import pytest

from runner import gatekit
from runner.views.plots import declared_plot, read_plot_document
from tests.runner.repo_fixtures import PY, cli, gate, make_repo, write
from tests.runner.run_samples import ROOT

LATENCY = gatekit.plot_document(
    [gatekit.Series("p50", [(1, 2.0), (8, 3.5), (64, 9.0)]),
     gatekit.Series("previous release", [(1, 2.5), (8, 4.0), (64, 12.0)], reference=True)],
    title="Latency vs batch", x=gatekit.Axis("batch", scale="log"), y=gatekit.Axis("latency", unit="ms"),
)


def test_declared_plot_is_inline_svg_with_the_reference_dashed():
    plot, notes = declared_plot(LATENCY, source="bench: latency.plot.json")
    assert notes == []
    assert plot.title == "Latency vs batch (bench: latency.plot.json)"
    assert plot.svg.startswith("<svg") and plot.svg.rstrip().endswith("</svg>")
    assert re.search(r'href="https?:', plot.svg) is None and "<image" not in plot.svg  # self-contained
    assert "latency (ms)" in plot.svg and "batch" in plot.svg
    assert "previous release (reference)" in plot.svg and "stroke-dasharray" in plot.svg


def broken(path: str, value: object) -> dict:
    document = copy.deepcopy(LATENCY)
    *parents, last = path.split(".")
    target = document
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return document


@pytest.mark.parametrize(
    ("document", "drawn", "note"),
    [
        ([1, 2], False, "expected a JSON object"),
        (broken("format", "other/1"), False, "expected format"),
        (broken("title", 3), False, "string title"),
        (broken("x", "batch"), False, "axis x"),
        (broken("y.scale", "cubic"), False, "axis y: expected scale"),
        (broken("series", {}), False, "list of series"),
        (broken("series", []), False, "no series"),
        (broken("series.0", "p50"), True, "series 0: expected an object"),
        (broken("series.1.reference", "yes"), True, "series 1: expected a string label"),
        (broken("series.0.points.1", [8, "fast"]), True, "series 'p50': 1 point(s)"),
        (broken("series.0.points.0", [0, 2.0]), True, "series 'p50': 1 point(s)"),  # x = 0 on a log axis
        (broken("series.0.points", [[1, float("nan")]]), True, "series 'p50': 1 point(s)"),
    ],
)
def test_wrong_types_are_skipped_with_a_note_never_raised(document, drawn, note):
    spec, notes = read_plot_document(document)
    assert (spec is not None) == drawn
    assert any(note in text for text in notes), notes
    plot, _ = declared_plot(document)
    assert (plot is not None) == drawn


def test_shell_gate_plot_reaches_the_html_report(tmp_path, runner_env):
    script = """\
from runner import gatekit

gatekit.write_metrics({"speedup": 2.0, "errors": 0})
gatekit.write_plot("latency", [gatekit.Series("p50", [(1, 2.0), (8, 3.5)]),
                               gatekit.Series("baseline", [(1, 3.0), (8, 5.0)], reference=True)],
                   title="Serving latency vs batch",
                   x=gatekit.Axis("batch", scale="log"), y=gatekit.Axis("latency", unit="ms"))
gatekit.write_artifact("odd.plot.json", '{"format": "runner.plot/1", "title": 5}')
"""
    phases = [{
        "id": "alpha", "title": "Serving", "status": "pending", "paths": ["src/"],
        "gates": [gate("latency", "benchmark", f"{PY} tools/latency.py", env={"PYTHONPATH": str(ROOT)},
                       expect={"speedup": ">= 1.5"})],
    }]
    repo = make_repo(tmp_path / "repo", phases)
    write(repo.root, "tools/latency.py", script)
    repo.git("add", "-A")
    repo.git("commit", "-q", "-m", "latency gate")
    result = cli(runner_env, repo.root, "advance")
    assert result.exit_code == 0, result.text
    assert cli(runner_env, repo.root, "report").exit_code == 0
    html = (repo.root / "reports" / "index.html").read_text()
    assert "Serving latency vs batch (latency: latency.plot.json)" in html
    assert "baseline (reference)" in html and "stroke-dasharray" in html
    assert "latency: odd.plot.json: expected a string title" in html
    run = next((repo.root / "reports" / "demo" / "alpha").glob("*/results.json"))
    gate_record = json.loads(run.read_text())["phases"][0]["gates"][0]
    assert gate_record["artifacts"] == {}  # results.json names the files; the text is in them
    plot_file = run.parent / gate_record["artifact_files"]["latency.plot.json"]
    assert json.loads(plot_file.read_text())["format"] == "runner.plot/1"
