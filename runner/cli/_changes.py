"""``runner history --changes``: the level changes of the phases' thresholded metrics, as text or JSON."""

from __future__ import annotations

import math

from runner.formatting import format_metric, json_text, one_line, short, text_columns
from runner.views.changes import LevelChange, level_changes, metric_series
from runner.views.runs import RunScan
from runner.workspace import Workspace


def changes_text(ws: Workspace, scan: RunScan, phase_id: str | None, as_json: bool) -> str:
    """Every level change of the followed metrics of ``phase_id`` (of every phase when ``None``)."""
    phases = [ws.plan.phase(phase_id)] if phase_id is not None else ws.plan.phases
    found: list[LevelChange] = []
    followed = []
    for phase in phases:
        for series in metric_series(phase, [run for run in scan.runs if run.phase == phase.id]):
            followed.append(series)
            found += level_changes(ws, phase, series)
    if as_json:
        return json_text({
            "plan": {"id": ws.plan.id, "path": ws.plan_rel},
            "changes": [change.to_json() for change in found],
            "series": [{"phase": s.phase, "gate": s.gate, "metric": s.metric, "machine": s.machine,
                        "machine_fingerprint": s.machine_fingerprint, "runs": len(s.runs)} for s in followed],
            "skipped": scan.skipped,
        })
    lines = [f"plan {ws.plan.id} ({ws.plan_rel})", "",
             "level changes (per machine fingerprint; a move counts beyond the gate's tolerance, 10% by default, "
             "and only when significant on the samples):"]
    if found:
        rows = [("phase", "gate", "metric", "machine", "from run", "commit", "before", "after", "change", "verdict")]
        rows += [(one_line(c.phase), one_line(c.gate), one_line(c.metric), f"{one_line(c.machine)} {short(c.machine_fingerprint)}",
                  c.run, (c.commit or "-")[:12], format_metric(c.before), format_metric(c.after), _percent(c.relative),
                  c.verdict) for c in found]
        lines += text_columns(rows)
    else:
        lines.append("  none found")
    runs = sum(len(series.runs) for series in followed)
    lines.append(f"({len(followed)} series of {runs} measurement(s) searched; before and after are the levels "
                 "of the runs on either side: the median of their medians)")
    lines += [f"skipped: {problem}" for problem in scan.skipped]
    return "\n".join(lines)


def _percent(relative: float) -> str:
    return f"{relative * 100:+.1f}%" if math.isfinite(relative) else ("+inf" if relative > 0 else "-inf")
