"""Plots for the HTML report, as inline SVG text (matplotlib, Agg backend, no external assets).

``benchmark_plots`` reads a benchmark artifact generically: a JSON object with ``rows``, each
row a mapping with ``context``, ``frac`` (fraction of the roofline) and ``kv_GBps``; rows of
``kind == "sweep"`` (or rows without a kind) are grouped into shapes by
``(num_heads, num_draft)``. A row's ``oracle_us`` (the naive oracle's time) gives the oracle's
bandwidth on the same bytes: ``kv_GBps * time_us / oracle_us``. ``metric_history_plot`` draws
one metric across runs over time, with its threshold.
"""

from __future__ import annotations

import io
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

SVG_RC = {"svg.fonttype": "none", "svg.hashsalt": "mla-gate"}


@dataclass(frozen=True)
class Plot:
    """A titled figure; ``svg`` is an ``<svg>`` element (no XML prolog) ready to inline."""

    title: str
    svg: str


@dataclass(frozen=True)
class Point:
    """One run's value of a metric; ``checkpoint`` marks the run a checkpoint records."""

    time: datetime
    value: float
    label: str
    checkpoint: bool = False


def benchmark_plots(bench: Mapping[str, object], *, source: str = "") -> list[Plot]:
    """Roofline fraction and KV bandwidth vs context per shape, with the oracle's bandwidth.

    Returns no plots when ``bench`` has no usable rows.
    """
    shapes = sweep_shapes(bench)
    if not shapes:
        return []
    suffix = f" ({source})" if source else ""
    plots = []
    fig, ax = _figure()
    for (heads, draft), rows in shapes.items():
        points = [(row["context"], row["frac"]) for row in rows if _number(row.get("frac"))]
        if points:
            ax.plot(*zip(*points), marker="o", label=f"H={heads} T={draft}")
    ax.set_ylabel("fraction of the same-run roofline")
    ax.set_ylim(bottom=0)
    plots.append(Plot(f"Roofline fraction vs context{suffix}", _finish(fig, ax)))

    fig, ax = _figure()
    oracle_drawn = False
    for (heads, draft), rows in shapes.items():
        points = [(row["context"], row["kv_GBps"]) for row in rows if _number(row.get("kv_GBps"))]
        if not points:
            continue
        line = ax.plot(*zip(*points), marker="o", label=f"H={heads} T={draft}")[0]
        oracle = [(row["context"], oracle_gbps(row)) for row in rows if oracle_gbps(row) is not None]
        if oracle:
            ax.plot(*zip(*oracle), linestyle="--", marker="x", color=line.get_color(), alpha=0.6,
                    label="_nolegend_" if oracle_drawn else "naive oracle (dashed, same colour)")
            oracle_drawn = True
    ax.set_ylabel("KV bandwidth (GB/s)")
    ax.set_yscale("log")
    title = "KV bandwidth vs context" + (", naive oracle dashed" if oracle_drawn else "")
    plots.append(Plot(title + suffix, _finish(fig, ax)))
    return plots


def sweep_shapes(bench: Mapping[str, object]) -> dict[tuple[object, object], list[Mapping]]:
    """The sweep rows grouped by ``(num_heads, num_draft)``, each group sorted by context."""
    rows = bench.get("rows") if isinstance(bench, Mapping) else None
    if not isinstance(rows, Sequence):
        return {}
    shapes: dict[tuple[object, object], list[Mapping]] = {}
    for row in rows:
        if not isinstance(row, Mapping) or row.get("kind", "sweep") != "sweep":
            continue
        if not _number(row.get("context")) or not (_number(row.get("frac")) or _number(row.get("kv_GBps"))):
            continue
        shapes.setdefault((row.get("num_heads"), row.get("num_draft")), []).append(row)
    for group in shapes.values():
        group.sort(key=lambda row: row["context"])
    return shapes


def oracle_gbps(row: Mapping[str, object]) -> float | None:
    """The oracle's bandwidth on the row's KV bytes, or ``None`` when it was not timed."""
    oracle, time, gbps = row.get("oracle_us"), row.get("time_us"), row.get("kv_GBps")
    if not (_number(oracle) and _number(time) and _number(gbps)) or oracle <= 0:
        return None
    return float(gbps) * float(time) / float(oracle)


def metric_history_plot(metric: str, points: Sequence[Point], *, threshold: tuple[str, float] | None = None,
                        title: str | None = None) -> Plot:
    """``metric`` across runs (x: run time); checkpoints drawn as stars; the threshold dotted."""
    fig, ax = _figure(height=2.6)
    ordered = sorted(points, key=lambda point: point.time)
    ax.plot([p.time for p in ordered], [p.value for p in ordered], marker="o", label=metric)
    marked = [p for p in ordered if p.checkpoint]
    if marked:
        ax.plot([p.time for p in marked], [p.value for p in marked], linestyle="none", marker="*",
                markersize=12, label="checkpoint")
    if threshold is not None:
        op, value = threshold
        ax.axhline(value, linestyle=":", color="grey", label=f"threshold {op} {value:g}")
    ax.set_ylabel(metric)
    if len({p.time for p in ordered}) == 1:  # one moment: a day around it, not years
        ax.set_xlim(ordered[0].time - timedelta(hours=12), ordered[0].time + timedelta(hours=12))
    _date_axis(ax)
    return Plot(title or metric, _finish(fig, ax, log_x=False))


def _figure(height: float = 3.6):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.2, height), layout="constrained")
    return fig, fig.add_subplot()


def _finish(fig, ax, *, log_x: bool = True) -> str:
    import matplotlib

    if log_x:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_tokens))
    ax.grid(True, which="major", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    buffer = io.StringIO()
    with matplotlib.rc_context(SVG_RC):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def _date_axis(ax) -> None:
    from matplotlib import dates

    locator = dates.AutoDateLocator(maxticks=6)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(dates.ConciseDateFormatter(locator))


def _tokens(value: float, _position: object) -> str:
    if value >= 1024 and math.isclose(value % 1024, 0, abs_tol=1e-6):
        return f"{value / 1024:g}k"
    return f"{value:g}"


def _number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))
