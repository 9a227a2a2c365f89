"""``runner history``: the runs under reports/ and the checkpoints of the plan."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from runner.cli._common import PLAN_HELP, domain_errors
from runner.errors import UsageError
from runner.formatting import json_text, one_line, short, text_columns
from runner.plan.schema import Phase, Plan
from runner.records.results import MetricCheck
from runner.records.run_folder import headline_metrics, headline_texts, target_checks
from runner.cli._changes import changes_text
from runner.views.history import describe_targets, plan_checkpoints
from runner.views.runs import RunRecord, describe_machine, find_runs
from runner.workspace import open_workspace


def history(
    phase: Annotated[
        str | None, typer.Argument(help="Only this phase's runs and checkpoint.", metavar="[PHASE]", show_default=False)
    ] = None,
    plan: Annotated[Path | None, typer.Option("--plan", metavar="FILE", help=PLAN_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
    changes: Annotated[
        bool,
        typer.Option("--changes",
                     help="Find where each thresholded metric's level moved: the change points over the "
                     "runs of one machine fingerprint, each with the run (and commit) where the new level "
                     "starts, before and after; a move counts beyond the gate's tolerance (10% by "
                     "default) and only when the samples make it significant."),
    ] = False,
) -> None:
    """List the runs of the plan (oldest first: run id, time, outcome, machine, fingerprints)
    from reports/PLAN/PHASE/RUN/results.json, and the phases' checkpoints; with --changes, where
    each thresholded metric's level moved.
    """
    with domain_errors():
        ws = open_workspace(plan)
        if phase is not None:
            ws.plan.phase(phase)  # an unknown phase is a usage error naming the known ones
        scan = find_runs(ws.root, ws.plan.id, phase)
        if changes:
            typer.echo(changes_text(ws, scan, phase, as_json))
            return
        checkpoints = [c for c in plan_checkpoints(ws) if phase is None or c.phase == phase]
    if as_json:
        typer.echo(json_text({
            "plan": {"id": ws.plan.id, "path": ws.plan_rel},
            "runs": [{**run.to_json(ws.root), "headline": _headline(ws.plan, run),
                      "targets": [check.model_dump(mode="json") for check in _targets(ws.plan, run)]}
                     for run in scan.runs],
            "checkpoints": [record.to_json() for record in checkpoints],
            "skipped": scan.skipped,
        }))
        return
    lines = [f"plan {ws.plan.id} ({ws.plan_rel})", "", "runs:"]
    if scan.runs:
        rows = [("phase", "run", "time", "outcome", "machine", "tree", "machine fp", "headline", "targets", "note")]
        rows += [
            (run.phase or "-", run.path.parent.name, run.results.created, run.outcome,
             describe_machine(run.machine), short(run.results.fingerprint), short(run.machine.fingerprint),
             _headline_text(ws.plan, run) or "-",
             describe_targets(_targets(ws.plan, run)) or "-", _note(run))
            for run in scan.runs
        ]
        lines += text_columns(rows)
    else:
        lines.append(f"  none under reports/{ws.plan.id}/")
    lines += ["", "checkpoints:"]
    if checkpoints:
        rows = [("phase", "tag", "time", "commit", "report")]
        rows += [
            (c.phase, c.tag, c.time, (c.commit or "-")[:12], c.report) for c in checkpoints
        ]
        lines += text_columns(rows)
    else:
        lines.append("  none yet")
    for problem in scan.skipped:
        lines.append(f"skipped: {problem}")
    typer.echo("\n".join(lines))



def _headline(plan: Plan, run: RunRecord) -> dict:
    """The run's headline metrics for its phase (``{}`` for a file of several phases)."""
    phase = _phase_of(plan, run)
    if phase is None:
        return {}
    [results] = run.phase_results()
    return headline_metrics(phase, results.gates)


def _headline_text(plan: Plan, run: RunRecord) -> str:
    """``speedup=2.31 (median of 20; 95% interval [2.1, 2.5]), errors=0``."""
    phase = _phase_of(plan, run)
    texts = headline_texts(phase, _headline(plan, run)) if phase is not None else {}
    return ", ".join(f"{one_line(name)}={text}" for name, text in texts.items())


def _targets(plan: Plan, run: RunRecord) -> list[MetricCheck]:
    """The plan's targets of the run's phase, checked against what the run measured."""
    phase = _phase_of(plan, run)
    if phase is None:
        return []
    [results] = run.phase_results()
    return target_checks(phase, results.gates)


def _phase_of(plan: Plan, run: RunRecord) -> Phase | None:
    """The plan's phase of a run found in its folder; ``None`` for a file of several phases or
    a folder of a phase the plan no longer has."""
    if run.phase is None:
        return None
    try:
        return plan.phase(run.phase)
    except UsageError:
        return None


def _note(run: RunRecord) -> str:
    if run.evidence:
        return f"evidence ({run.meta.reason})" if run.meta.reason else "evidence"
    if not run.meta.recorded:
        return run.meta.reason or "not recorded in the plan"
    return ""
