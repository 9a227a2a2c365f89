"""``runner report``: one self-contained static HTML page for a plan. Reads only, writes one file.

The page (``runner/templates/index.html.j2``) shows the phases as a timeline with their status
and checkpoint (tag, commit, report), each phase's newest run with its gates and metric checks,
and inline SVG plots: every ``*.plot.json`` artifact of the newest run (the declared
``runner.plot/1`` format, see ``runner.gatekit``) and every headline metric across the phase's
runs. An artifact that does not follow the format is named in a note, not drawn. Links
are relative to the HTML file, and nothing is loaded from elsewhere, so the page reads from
disk without a server or network.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import runner
from runner.atomic import write_atomic
from runner.errors import ReportError
from runner.formatting import format_metric, short
from runner.protocol import PLOT_SUFFIX
from runner.plan.schema import Phase
from runner.records.places import check_reports
from runner.plan.samples import is_samples, median_interval, representative
from runner.records.results import GateResult, MetricCheck
from runner.records.run_folder import headline_metrics, headline_texts, metric_confidence, read_artifacts, target_checks
from runner.records.run_folder import REPORTS_DIR
from runner.templating import template_env
from runner.timeutil import iso_time, utc_now
from runner.views.history import phase_headline
from runner.views.runs import PhaseRuns, RunRecord, RunScan, describe_machine, find_runs, parse_time, phase_runs
from runner.views.changes import level_changes, metric_series
from runner.views.plots import Plot, Point, Step, declared_plot, metric_history_plot
from runner.views.status import PhaseView, plan_status
from runner.workspace import Workspace

TEMPLATE = "index.html.j2"
DEFAULT_OUT = Path(REPORTS_DIR) / "index.html"


@dataclass(frozen=True)
class PhaseSection:
    """What the page shows for one phase; links are relative to the HTML file."""

    spec: Phase
    view: PhaseView
    report_link: str | None
    runs: int
    latest: RunRecord | None
    latest_link: str | None
    gates: list[GateResult]
    plots: list[Plot] = field(default_factory=list)
    plot_notes: list[str] = field(default_factory=list)
    others: list[tuple[str, RunRecord, str]] = field(default_factory=list)  # (what, run, link)
    headline: dict = field(default_factory=dict)  # as runner status shows it: name -> text
    targets: list[MetricCheck] = field(default_factory=list)  # the plan's targets against the latest run

    @property
    def latest_outcome(self) -> str | None:
        return self.latest.outcome if self.latest is not None else None


def render_html_report(ws: Workspace, out: Path) -> str:
    """The HTML page of the plan in ``ws``, with links relative to where ``out`` will be."""
    out_dir = Path(out).resolve().parent
    status = plan_status(ws)
    scan = find_runs(ws.root, ws.plan.id)
    by_phase = phase_runs(scan)
    sections = [
        _section(ws, spec, view, scan, by_phase.get(spec.id) or PhaseRuns(), out_dir)
        for spec, view in zip(ws.plan.phases, status.phases, strict=True)
    ]
    env = template_env(html=True, filters={"metric": format_metric, "short": short})
    return env.get_template(TEMPLATE).render(
        plan=ws.plan,
        plan_path=ws.plan_rel,
        status=status,
        sections=sections,
        skipped=scan.skipped,
        generated=iso_time(utc_now()),
        tool=runner.TOOL,
        describe_machine=describe_machine,
    )


def write_html_report(ws: Workspace, out: Path) -> Path:
    """Render the page and write it to ``out`` (folders created); return ``out``.

    An ``out`` inside the repository's ``reports/`` folder (the default) is checked as the
    runs' folders are (``runner.records.places.check_reports``): one that a symbolic link there
    leads outside the repository is refused with ``UsageError``. A path elsewhere is written
    wherever it leads: the user named it. The page at the default place is generated, so git is
    told to ignore it (``ignore_default_page``). A disk that refuses the page is a ``ReportError``.
    """
    out = Path(out)
    target = Path(os.path.abspath(out))
    if _in_reports(ws.root, target):
        check_reports(ws.root, REPORTS_DIR, target.parent, ws.plan_rel, git=False)
    text = render_html_report(ws, out)
    try:
        write_atomic(out, text, make_parents=True)
        if target == Path(os.path.abspath(ws.root / DEFAULT_OUT)):
            ignore_default_page(target.parent)
    except OSError as exc:
        raise ReportError(f"cannot write {out}: {exc.strerror or exc}") from None
    return out


def ignore_default_page(reports: Path) -> None:
    """A ``reports/.gitignore`` that ignores the generated page and itself, so ``runner report``
    leaves ``git status`` clean; made only when ``reports/`` has no ``.gitignore`` of its own."""
    try:
        fd = os.open(reports / ".gitignore", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(f"# Written by `runner report`: the page is made from the runs (git add -f keeps it).\n"
                     f"/{DEFAULT_OUT.name}\n/.gitignore\n")


def _in_reports(root: Path, target: Path) -> bool:
    """Whether the absolute ``target`` names a place under ``<root>/reports/``, as written (its
    links not followed below the root; the root may be reached through one)."""
    real_root = Path(os.path.realpath(root))
    for folder in reversed(target.parents):
        if Path(os.path.realpath(folder)) == real_root:
            parts = target.relative_to(folder).parts
            return len(parts) > 1 and parts[0] == REPORTS_DIR
    return False


def _section(ws: Workspace, spec: Phase, view: PhaseView, scan: RunScan, summary: PhaseRuns,
             out_dir: Path) -> PhaseSection:
    """The phase's section; its main run is the newest informative one (``PhaseRuns.shown``):
    a later run that could only block, or evidence, is listed under it, never in its place."""
    latest = summary.shown
    report_link = None
    checkpoint_run = None
    if view.checkpoint is not None:
        report_link = _link(ws.root / view.checkpoint.report, out_dir)
        checkpoint_run = (ws.root / view.checkpoint.report).parent.resolve()
    runs = [run for run in scan.runs if run.phase == spec.id]
    gates: list[GateResult] = []
    plots: list[Plot] = []
    plot_notes: list[str] = []
    latest_link = None
    if latest is not None:
        [phase_results] = latest.phase_results()
        gates = phase_results.gates
        report = latest.path.parent / "report.md"
        latest_link = _link(report if report.is_file() else latest.path, out_dir)
        plots, plot_notes = _artifact_plots(latest.path.parent, gates)
    plots += _history_plots(spec, runs, checkpoint_run, _steps(ws, spec, runs))
    others = []
    for what, run in (("blocked", summary.blocked), ("evidence", summary.evidence)):
        if run is not None and run is not latest:
            report = run.path.parent / "report.md"
            label = f"evidence ({run.meta.reason})" if what == "evidence" and run.meta.reason else what
            others.append((label, run, _link(report if report.is_file() else run.path, out_dir)))
    headline = headline_texts(spec, phase_headline(ws.plan, spec.id, view.checkpoint, summary)[0])
    targets = target_checks(spec, gates) if latest is not None else []
    return PhaseSection(spec, view, report_link, len(runs), latest, latest_link, gates, plots, plot_notes,
                        others, headline, targets)


def _artifact_plots(run_dir: Path, gates: list[GateResult]) -> tuple[list[Plot], list[str]]:
    """Every ``*.plot.json`` artifact of these gates drawn, and a note per skipped part."""
    plots, notes = [], []
    for gate in gates:
        for name, text in sorted(read_artifacts(run_dir, gate).items()):
            if not name.endswith(PLOT_SUFFIX):
                continue
            source = f"{gate.name}: {name}"
            try:
                data = json.loads(text)
            except json.JSONDecodeError as exc:
                notes.append(f"{source}: not JSON ({exc.msg}); not drawn")
                continue
            plot, problems = declared_plot(data, source=source)
            notes += [f"{source}: {problem}" for problem in problems]
            if plot is not None:
                plots.append(plot)
            elif not problems:
                notes.append(f"{source}: not drawn")
    return plots, notes


def _steps(ws: Workspace, spec: Phase, runs: list[RunRecord]) -> dict[str, list[Step]]:
    """The level changes of the phase's followed metrics (``runner.views.changes``), by metric,
    as plot marks; the machine is named where the metric has series on several."""
    series = metric_series(spec, runs)
    machines: dict[str, set[str]] = {}
    for one in series:
        machines.setdefault(one.metric, set()).add(one.machine_fingerprint)
    steps: dict[str, list[Step]] = {}
    for one in series:
        for change in level_changes(ws, spec, one):
            where = f" ({change.machine})" if len(machines[one.metric]) > 1 else ""
            change_text = f"{change.relative * 100:+.0f}%" if math.isfinite(change.relative) else "from 0"
            steps.setdefault(one.metric, []).append(
                Step(parse_time(change.time), change.before, change.after, f"{change_text} {change.verdict}{where}"))
    return steps


def _history_plots(spec: Phase, runs: list[RunRecord], checkpoint_run: Path | None,
                   steps: dict[str, list[Step]] | None = None) -> list[Plot]:
    thresholds = {
        metric: (threshold.op, threshold.value)
        for gate in reversed(spec.gates)
        for metric, threshold in gate.expect.items()
    }
    plots = []
    for metric in spec.headline_metrics():
        points = []
        for run in runs:
            [phase_results] = run.phase_results()
            reported = headline_metrics(spec, phase_results.gates).get(metric)
            value = representative(reported)  # samples: the median, drawn with its interval
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            interval = median_interval(reported, metric_confidence(spec, metric)) if is_samples(reported) else None
            bounded = interval is not None and interval.bounded
            points.append(
                Point(run.created, float(value), run.run_id,
                      checkpoint=run.path.parent.resolve() == checkpoint_run,
                      low=interval.low if bounded else None, high=interval.high if bounded else None)
            )
        if points:
            plots.append(
                metric_history_plot(metric, points, threshold=thresholds.get(metric),
                                    title=f"{metric} across {len(points)} run(s)", steps=(steps or {}).get(metric, ()))
            )
    return plots


def _link(target: Path, out_dir: Path) -> str:
    return Path(os.path.relpath(Path(target).resolve(), out_dir)).as_posix()
