"""The gate-side helper: a no-op outside the runner, the protocol's files inside it, and a plot
format that the report's reader accepts as written."""

from __future__ import annotations

import json

import pytest

from runner import gatekit
from runner.protocol import GateFiles
from runner.views.plots import read_plot_document


@pytest.fixture
def inside_runner(tmp_path, monkeypatch):
    files = GateFiles.inside(tmp_path)
    files.artifacts.mkdir()
    for name, value in files.environment("latency").items():
        monkeypatch.setenv(name, value)
    return files


@pytest.fixture
def outside_runner(monkeypatch):
    for name in GateFiles.inside(".").environment("x"):
        monkeypatch.delenv(name, raising=False)


def test_everything_is_a_no_op_outside_the_runner(outside_runner):
    assert gatekit.gate_name() is None and gatekit.artifacts_dir() is None
    gatekit.progress(1, 2)
    assert gatekit.write_metrics({"a": 1}) is None
    assert gatekit.write_artifact("notes.md", "x") is None
    assert gatekit.write_plot("p", [gatekit.Series("s", [(1, 2)])], title="t", x=gatekit.Axis("x"),
                              y=gatekit.Axis("y")) is None


def test_writes_the_protocol_files(inside_runner):
    files = inside_runner
    assert gatekit.gate_name() == "latency" and gatekit.artifacts_dir() == files.artifacts
    gatekit.progress(1, 4)
    gatekit.progress(2)
    lines = [json.loads(line) for line in files.progress.read_text().splitlines()]
    assert lines == [{"done": 1, "total": 4}, {"done": 2}]
    gatekit.write_metrics({"p50_ms": 2.5, "ok": True})
    assert json.loads(files.metrics.read_text()) == {"p50_ms": 2.5, "ok": True}
    assert gatekit.write_artifact("table.md", "| a |\n") == files.artifacts / "table.md"


def test_refuses_what_the_runner_would_skip(inside_runner):
    with pytest.raises(ValueError, match="artifact name"):
        gatekit.write_artifact("../escape.md", "x")
    with pytest.raises(ValueError, match="at most"):
        gatekit.write_artifact("big.txt", "x" * ((1 << 20) + 1))
    with pytest.raises(ValueError, match="lists of numbers"):
        gatekit.write_metrics({"rows": [[1], [2]]})
    with pytest.raises(ValueError, match="lists of numbers"):
        gatekit.write_metrics({"rows": [1, True]})
    with pytest.raises(ValueError, match="scale"):
        gatekit.Axis("x", scale="cubic")


def test_a_written_plot_reads_back_exactly(inside_runner):
    path = gatekit.write_plot(
        "latency",
        [gatekit.Series("p50", [(1, 2.0), (8, float("nan")), (64, 9.0)]),
         gatekit.Series("baseline", [(1, 3.0)], reference=True)],
        title="Latency vs batch", x=gatekit.Axis("batch", scale="log"), y=gatekit.Axis("latency", unit="ms"),
    )
    assert path.name == "latency.plot.json"
    spec, notes = read_plot_document(json.loads(path.read_text()))
    assert notes == []
    assert spec.title == "Latency vs batch" and spec.x.scale == "log" and spec.y.text == "latency (ms)"
    assert [(s.label, s.points, s.reference) for s in spec.series] == [
        ("p50", ((1.0, 2.0), (64.0, 9.0)), False),  # the NaN point was dropped when written
        ("baseline", ((1.0, 3.0),), True),
    ]


def test_samples_are_written_as_lists(inside_runner):
    path = gatekit.write_metrics({"ms": (1.5, 2, 1.25), "label": "x"})
    assert json.loads(path.read_text()) == {"ms": [1.5, 2, 1.25], "label": "x"}
