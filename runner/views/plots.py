"""Plots for the HTML report, as inline SVG text (matplotlib, Agg backend, no external assets).

``declared_plot`` draws one ``*.plot.json`` artifact in the declared ``runner.plot/1`` format
(written by ``runner.gatekit.write_plot``; the format is in that module's docstring). The
runner knows nothing of what a gate measures: titles, axes and series all come from the
artifact. The reader is defensive: a field of the wrong type skips that series, point or the
whole figure with a note, never an exception. ``metric_history_plot`` draws one metric across
runs over time, with its threshold.
"""

from __future__ import annotations

import io
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from runner.formatting import one_line
from runner.protocol import PLOT_FORMAT

SVG_RC = {"svg.fonttype": "none", "svg.hashsalt": "mla-gate"}
SCALES = ("linear", "log")
INTERVAL_LABEL = "interval of the median"


@dataclass(frozen=True)
class Plot:
    """A titled figure; ``svg`` is an ``<svg>`` element (no XML prolog) ready to inline."""

    title: str
    svg: str


@dataclass(frozen=True)
class Point:
    """One run's value of a metric; ``checkpoint`` marks the run a checkpoint records. A metric
    reported as samples is its median, with ``low``/``high`` the interval of the median."""

    time: datetime
    value: float
    label: str
    checkpoint: bool = False
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class Step:
    """A level change to mark on a history plot: the new level starts at ``time``; ``label``
    says by how much (``+30% worse``)."""

    time: datetime
    before: float
    after: float
    label: str


@dataclass(frozen=True)
class AxisSpec:
    """One axis of a declared plot."""

    label: str
    unit: str = ""
    scale: str = "linear"

    @property
    def text(self) -> str:
        return f"{self.label} ({self.unit})" if self.unit else self.label


@dataclass(frozen=True)
class SeriesSpec:
    """One line of a declared plot; ``reference`` lines (baseline, ceiling, peer) are dashed."""

    label: str
    points: tuple[tuple[float, float], ...]
    reference: bool = False


@dataclass(frozen=True)
class PlotSpec:
    """A validated ``runner.plot/1`` document."""

    title: str
    x: AxisSpec
    y: AxisSpec
    series: tuple[SeriesSpec, ...]


def read_plot_document(data: object) -> tuple[PlotSpec | None, list[str]]:
    """Validate a ``runner.plot/1`` object: the spec (``None`` when nothing can be drawn) and notes.

    Notes say what was skipped and why; a wrong top-level shape skips the whole figure, a
    wrong series or point skips only that series or point.
    """
    if not isinstance(data, Mapping):
        return None, [f"expected a JSON object, got {type(data).__name__}"]
    if data.get("format") != PLOT_FORMAT:
        return None, [f"expected format {PLOT_FORMAT!r}, got {data.get('format')!r}"]
    notes: list[str] = []
    title = data.get("title")
    if not isinstance(title, str):
        return None, [f"expected a string title, got {type(title).__name__}"]
    axes = []
    for name in ("x", "y"):
        axis, problem = _read_axis(data.get(name))
        if axis is None:
            return None, [f"axis {name}: {problem}"]
        axes.append(axis)
    x, y = axes
    raw_series = data.get("series")
    if not isinstance(raw_series, list):
        return None, [f"expected a list of series, got {type(raw_series).__name__}"]
    series = []
    for index, raw in enumerate(raw_series):
        line, line_notes = _read_series(raw, index, x, y)
        notes += line_notes
        if line is not None:
            series.append(line)
    if not series:
        return None, notes + ["no series with points to draw"]
    return PlotSpec(title, x, y, tuple(series)), notes


def declared_plot(data: object, *, source: str = "") -> tuple[Plot | None, list[str]]:
    """Draw a ``runner.plot/1`` object: the plot (``None`` when unusable) and notes on what was
    skipped. Never raises: a figure the plotting library cannot draw is a note too."""
    spec, notes = read_plot_document(data)
    if spec is None:
        return None, notes
    try:
        with _style():
            return _draw(spec, source), notes
    except Exception as exc:  # noqa: BLE001 - the promise: a gate's artifact never breaks the report
        return None, [*notes, f"could not be drawn ({type(exc).__name__}: {one_line(exc)[:200]})"]


def _draw(spec: PlotSpec, source: str) -> Plot:
    fig, ax = _figure()
    for line in spec.series:
        xs, ys = zip(*line.points)
        if line.reference:
            ax.plot(xs, ys, linestyle="--", marker="x", alpha=0.8, label=_label(f"{line.label} (reference)"))
        else:
            ax.plot(xs, ys, marker="o", label=_label(line.label))
    for axis, spec_axis in ((ax.xaxis, spec.x), (ax.yaxis, spec.y)):
        axis.set_label_text(_label(spec_axis.text))
    if spec.x.scale == "log":
        ax.set_xscale("log", base=2 if _powers_of_two(spec) else 10)
    if spec.y.scale == "log":
        ax.set_yscale("log")
    suffix = f" ({source})" if source else ""
    return Plot(spec.title + suffix, _finish(fig, ax))


def _read_axis(raw: object) -> tuple[AxisSpec | None, str]:
    if not isinstance(raw, Mapping):
        return None, f"expected an object, got {type(raw).__name__}"
    label, unit, scale = raw.get("label"), raw.get("unit", ""), raw.get("scale", "linear")
    if not isinstance(label, str) or not isinstance(unit, str):
        return None, "expected string label and unit"
    if scale not in SCALES:
        return None, f"expected scale 'linear' or 'log', got {scale!r}"
    return AxisSpec(label, unit, scale), ""


def _read_series(raw: object, index: int, x: AxisSpec, y: AxisSpec) -> tuple[SeriesSpec | None, list[str]]:
    if not isinstance(raw, Mapping):
        return None, [f"series {index}: expected an object, got {type(raw).__name__}; skipped"]
    label, reference, raw_points = raw.get("label"), raw.get("reference", False), raw.get("points")
    if not isinstance(label, str) or not isinstance(reference, bool) or not isinstance(raw_points, list):
        return None, [f"series {index}: expected a string label, a boolean reference and a list of points; skipped"]
    points, dropped = [], 0
    for point in raw_points:
        if (isinstance(point, Sequence) and not isinstance(point, str) and len(point) == 2
                and all(_number(value) for value in point)
                and (x.scale != "log" or point[0] > 0) and (y.scale != "log" or point[1] > 0)):
            points.append((float(point[0]), float(point[1])))
        else:
            dropped += 1
    notes = [f"series {label!r}: {dropped} point(s) not two finite numbers (positive on a log axis); skipped"] \
        if dropped else []
    if not points:
        return None, notes
    return SeriesSpec(label, tuple(sorted(points)), reference), notes


def _powers_of_two(spec: PlotSpec) -> bool:
    xs = [px for line in spec.series for px, _ in line.points]
    return all(px >= 1 and math.log2(px).is_integer() for px in xs)


def metric_history_plot(metric: str, points: Sequence[Point], *, threshold: tuple[str, float] | None = None,
                        title: str | None = None, steps: Sequence[Step] = ()) -> Plot:
    """``metric`` across runs (x: run time); checkpoints drawn as stars; the threshold dotted; a
    sampled run's interval of the median as an error bar around its median; each level change
    (``runner history --changes``) a dashed vertical line at its first run, labelled, with the
    levels before and after it as short horizontal strokes."""
    with _style():
        return _history(metric, points, threshold, title, steps)


def _history(metric: str, points: Sequence[Point], threshold: tuple[str, float] | None, title: str | None,
             steps: Sequence[Step] = ()) -> Plot:
    fig, ax = _figure(height=2.6)
    ordered = sorted(points, key=lambda point: point.time)
    ax.plot([p.time for p in ordered], [p.value for p in ordered], marker="o", label=_label(metric))
    ranged = [p for p in ordered if p.low is not None and p.high is not None]
    if ranged:
        below = [max(p.value - p.low, 0.0) for p in ranged]
        above = [max(p.high - p.value, 0.0) for p in ranged]
        ax.errorbar([p.time for p in ranged], [p.value for p in ranged], yerr=[below, above], fmt="none",
                    capsize=4, ecolor="#1d2330", elinewidth=1, label=_label(INTERVAL_LABEL))
    marked = [p for p in ordered if p.checkpoint]
    if marked:
        ax.plot([p.time for p in marked], [p.value for p in marked], linestyle="none", marker="*",
                markersize=12, label="checkpoint")
    if threshold is not None:
        op, value = threshold
        ax.axhline(value, linestyle=":", color="grey", label=f"threshold {op} {value:g}")
    times = [p.time for p in ordered]
    for index, step in enumerate(sorted(steps, key=lambda step: step.time)):
        ax.axvline(step.time, linestyle="--", color="#c0392b", linewidth=1,
                   label="level change" if index == 0 else None)
        earlier = [t for t in times if t < step.time] or [step.time]
        later = [t for t in times if t >= step.time] or [step.time]
        ax.hlines([step.before], earlier[max(0, len(earlier) - 3)], step.time, colors="#c0392b", linewidth=2)
        ax.hlines([step.after], step.time, later[min(len(later) - 1, 2)], colors="#c0392b", linewidth=2)
        ax.annotate(_label(step.label), xy=(step.time, step.after), xytext=(4, 4), textcoords="offset points",
                    fontsize=7, color="#c0392b")
    ax.set_ylabel(_label(metric))
    if len({p.time for p in ordered}) == 1:  # one moment: a day around it, not years
        ax.set_xlim(ordered[0].time - timedelta(hours=12), ordered[0].time + timedelta(hours=12))
    _date_axis(ax)
    return Plot(title or metric, _finish(fig, ax))


def _label(text: str) -> str:
    """A label from a gate or a plan as literal text: ``$`` escaped, so ``context ($\\mus$)`` is
    not read as TeX (which can raise). The axes' own tick labels keep their math."""
    return text.replace("$", r"\$")


def _style():
    """The settings every figure is made and saved under (``SVG_RC``)."""
    import matplotlib

    return matplotlib.rc_context(SVG_RC)


def _figure(height: float = 3.6):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.2, height), layout="constrained")
    return fig, fig.add_subplot()


def _finish(fig, ax) -> str:
    ax.grid(True, which="major", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def _date_axis(ax) -> None:
    from matplotlib import dates

    locator = dates.AutoDateLocator(maxticks=6)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(dates.ConciseDateFormatter(locator))


def _number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
