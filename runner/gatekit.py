"""What a gate imports to talk to the runner: progress, artifacts, plots and metrics.

A callable gate (``call: pkg.mod:func``) returns its metrics as a dict; a shell gate, or a
callable that wants its metrics on disk early, calls ``write_metrics``. Everything here is a
no-op returning ``None`` when the gate runs outside the runner (the ``RUNNER_*`` variables are
unset), so the same code serves a gate run by hand.

    from runner import gatekit

    for i, case in enumerate(cases):
        ...
        gatekit.progress(i + 1, len(cases))
    gatekit.write_artifact("cases.md", table)
    gatekit.write_plot("latency", [gatekit.Series("p50", points),
                                   gatekit.Series("previous release", baseline, reference=True)],
                       title="Latency vs batch size",
                       x=gatekit.Axis("batch", scale="log"),
                       y=gatekit.Axis("latency", unit="ms"))

The plot format (``runner.plot/1``, one JSON object per ``<name>.plot.json`` artifact)::

    {"format": "runner.plot/1", "title": str,
     "x": {"label": str, "unit": str, "scale": "linear" | "log"},
     "y": {"label": str, "unit": str, "scale": "linear" | "log"},
     "series": [{"label": str, "points": [[x, y], ...], "reference": bool}, ...]}

``reference`` series (a baseline, a ceiling, a peer) are drawn dashed beside the measured ones.
This module needs nothing beyond the standard library: gates of any project can use it.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from runner.protocol import (
    ARTIFACT_NAME_PATTERN,
    ARTIFACTS_ENV,
    GATE_ENV,
    MAX_ARTIFACT_BYTES,
    METRICS_ENV,
    PLOT_FORMAT,
    PLOT_SUFFIX,
    PROGRESS_ENV,
)

__all__ = [
    "Axis",
    "Series",
    "artifacts_dir",
    "gate_name",
    "plot_document",
    "progress",
    "write_artifact",
    "write_metrics",
    "write_plot",
]

_NAME = re.compile(ARTIFACT_NAME_PATTERN)


@dataclass(frozen=True)
class Axis:
    """One axis of a plot: its label, unit (may be empty) and scale (``linear`` or ``log``)."""

    label: str
    unit: str = ""
    scale: str = "linear"

    def __post_init__(self) -> None:
        if self.scale not in ("linear", "log"):
            raise ValueError(f"Expected scale 'linear' or 'log', got {self.scale!r}")


@dataclass(frozen=True)
class Series:
    """A labelled line of ``(x, y)`` points; ``reference`` marks an oracle, ceiling or peer."""

    label: str
    points: Sequence[tuple[float, float]] = field(default_factory=tuple)
    reference: bool = False


def gate_name() -> str | None:
    """The name of the gate being run, or ``None`` outside the runner."""
    return os.environ.get(GATE_ENV) or None


def artifacts_dir() -> Path | None:
    """The folder whose small text files the runner keeps with the report, or ``None``."""
    folder = os.environ.get(ARTIFACTS_ENV)
    return Path(folder) if folder else None


def progress(done: int, total: int | None = None) -> None:
    """Tell the runner how far the gate is (shown while it runs, and in CI logs)."""
    target = os.environ.get(PROGRESS_ENV)
    if not target:
        return
    record: dict[str, int] = {"done": int(done)}
    if total is not None:
        record["total"] = int(total)
    with open(target, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


def write_metrics(metrics: Mapping[str, bool | int | float | str | Sequence[int | float]]) -> Path | None:
    """Write the gate's metrics (a shell gate's way to report them); returns the file or ``None``.

    A metric may be a list (or tuple) of numbers: its samples, whose thresholds the runner
    judges on a confidence interval of their median.
    """
    target = os.environ.get(METRICS_ENV)
    if not target:
        return None
    data: dict[str, object] = {}
    bad = []
    for key, value in metrics.items():
        if isinstance(value, (list, tuple)) and all(
            isinstance(item, (int, float)) and not isinstance(item, bool) for item in value
        ):
            data[key] = list(value)
        elif isinstance(value, (bool, int, float, str)):
            data[key] = value
        else:
            bad.append(key)
    if bad:
        raise ValueError(f"Expected metrics of numbers, strings, booleans or lists of numbers, got others for {bad}")
    path = Path(target)
    path.write_text(json.dumps(data, allow_nan=True) + "\n", encoding="utf-8")
    return path


def write_artifact(name: str, text: str) -> Path | None:
    """Leave a small UTF-8 text file for the report; returns its path, or ``None`` outside the runner.

    Raises ``ValueError`` for a name the runner would skip (not letters, digits and ``._-``)
    or a text over the runner's size limit, so the gate learns it at once, not from the log.
    """
    folder = artifacts_dir()
    if not _NAME.fullmatch(name):
        raise ValueError(f"Expected an artifact name of letters, digits and ._-, got {name!r}")
    data = text.encode("utf-8")
    if len(data) > MAX_ARTIFACT_BYTES:
        raise ValueError(f"Expected an artifact of at most {MAX_ARTIFACT_BYTES} bytes, got {len(data)} for {name!r}")
    if folder is None:
        return None
    path = folder / name
    path.write_bytes(data)
    return path


def plot_document(series: Iterable[Series], *, title: str, x: Axis, y: Axis) -> dict:
    """The ``runner.plot/1`` object for these series (non-finite points dropped)."""
    lines = []
    for line in series:
        points = [[float(px), float(py)] for px, py in line.points
                  if math.isfinite(float(px)) and math.isfinite(float(py))]
        lines.append({"label": str(line.label), "points": points, "reference": bool(line.reference)})
    axis = lambda a: {"label": a.label, "unit": a.unit, "scale": a.scale}  # noqa: E731
    return {"format": PLOT_FORMAT, "title": title, "x": axis(x), "y": axis(y), "series": lines}


def write_plot(name: str, series: Iterable[Series], *, title: str, x: Axis, y: Axis) -> Path | None:
    """Leave one figure as ``<name>.plot.json`` for the HTML report (see the module docstring)."""
    document = plot_document(series, title=title, x=x, y=y)
    return write_artifact(name + PLOT_SUFFIX, json.dumps(document, indent=1) + "\n")
