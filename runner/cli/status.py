"""``runner status``: show every phase, its last checkpoint and which phase is next."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from runner.cli._common import PLAN_HELP, domain_errors, stdout_console
from runner.formatting import json_text, one_line
from runner.plan.schema import Plan
from runner.records.results import MetricCheck
from runner.records.run_folder import headline_texts
from runner.views.history import describe_phase, describe_targets, phase_headline, phase_targets
from runner.views.runs import PhaseRuns, find_shown_runs
from runner.views.status import StatusView, plan_status
from runner.workspace import open_workspace


def status(
    plan: Annotated[Path | None, typer.Option("--plan", metavar="FILE", help=PLAN_HELP)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Show each phase's status, last checkpoint and headline metrics, and the next phase."""
    with domain_errors():
        ws = open_workspace(plan)
        view = plan_status(ws)
        runs, skipped = find_shown_runs(ws.root, ws.plan.id)
    for problem in skipped:
        typer.echo(f"runner: warning: {problem}", err=True)
    described = {p.id: describe_phase(p.status, runs.get(p.id), socket.gethostname()) for p in view.phases}
    facts = {
        p.id: _Facts(phase_headline(ws.plan, p.id, p.checkpoint, runs.get(p.id)),
                     phase_targets(ws.plan, p.id, p.checkpoint, runs.get(p.id)))
        for p in view.phases
    }
    if as_json:
        data = view.to_json()
        for phase in data["phases"]:
            found = facts[phase["id"]]
            phase["summary"] = described[phase["id"]]
            phase["headline"], phase["headline_source"] = found.headline
            phase["targets"] = [check.model_dump(mode="json") for check in found.targets[0]]
            phase["targets_source"] = found.targets[1]
            phase["runs"] = _runs_json(runs.get(phase["id"]))
        typer.echo(json_text(data))
        return
    console = stdout_console()
    if console.is_terminal:
        console.print(_table(ws.plan, view, described, facts))
    else:
        typer.echo(_plain(ws.plan, view, described, facts))


@dataclass(frozen=True)
class _Facts:
    """A phase's headline metrics and targets, each with where it comes from."""

    headline: tuple[dict, str | None]
    targets: tuple[list[MetricCheck], str | None]


def _runs_json(runs: PhaseRuns | None) -> dict:
    def one(run):
        return None if run is None else {"run_id": run.run_id, "outcome": run.outcome,
                                         "gpu": run.machine.gpu_name, "reason": run.meta.reason}

    if runs is None:
        return {"count": 0, "verdict": None, "blocked": None, "evidence": None}
    return {"count": runs.count, "verdict": one(runs.verdict), "blocked": one(runs.blocked),
            "evidence": one(runs.evidence)}


def _changed_text(changed: list[str], shown: int = 3) -> str:
    """``changed since the checkpoint: 2 files under its paths (a.py, b.py): record it again``."""
    names = ", ".join(one_line(name) for name in changed[:shown]) + (", ..." if len(changed) > shown else "")
    count = f"{len(changed)} file{'s' if len(changed) != 1 else ''}"
    return (f"changed since the checkpoint: {count} under its paths ({names}); its evidence is of other code, "
            "record it again (docs/runner.md, 'Recording a phase again')")


def _tag_missing_text(tag: str, commit: str | None) -> str:
    """Silence would read as "unchanged": say that the check could not run, and how to restore it;
    or, with the commit found from its report, which commit the check ran against."""
    if commit:
        return (f"tag {one_line(tag)} not found: the checkpoint's commit was found from its report, {commit[:12]} "
                f"(fetch the tags, or tag it again: git tag -a {one_line(tag)} {commit[:12]})")
    return (f"tag {one_line(tag)} not found: what changed since the checkpoint cannot be told (fetch the tags, "
            "or tag the checkpoint's commit again)")


def _metrics(plan: Plan, phase_id: str, metrics: dict) -> str:
    """``speedup=2.31 (median of 20; 95% interval [2.1, 2.5]), errors=0``."""
    texts = headline_texts(plan.phase(phase_id), metrics)
    return ", ".join(f"{one_line(name)}={text}" for name, text in texts.items())


def _table(plan: Plan, view: StatusView, described: dict[str, str], facts: dict[str, _Facts]) -> Table:
    table = Table(title=f"{view.plan_id}: {view.plan_title}" if view.plan_title else view.plan_id)
    for column in ("", "phase", "status", "checkpoint", "time", "commit", "headline metrics", "targets"):
        table.add_column(column)
    for phase in view.phases:
        record = phase.checkpoint
        table.add_row(
            "→" if phase.next else "",
            phase.id,
            described[phase.id] + (f"; {_changed_text(record.changed)}" if record and record.changed else "")
            + (f"; {_tag_missing_text(record.tag, record.commit)}" if record and record.tag_missing else ""),
            record.tag if record else "",
            record.time if record else "",
            (record.commit or "")[:12] if record else "",
            _metrics(plan, phase.id, facts[phase.id].headline[0]),
            describe_targets(facts[phase.id].targets[0]),
        )
    table.caption = f"next: {view.next_phase}" if view.next_phase else "every phase is complete"
    return table


def _plain(plan: Plan, view: StatusView, described: dict[str, str], facts: dict[str, _Facts]) -> str:
    lines = [f"plan {view.plan_id} ({view.plan_path})"]
    for phase in view.phases:
        marker = "->" if phase.next else "  "
        lines.append(f"{marker} {phase.id}: {described[phase.id]}")
        record = phase.checkpoint
        if record is not None:
            commit = f" commit {record.commit[:12]}" if record.commit else ""
            lines.append(f"     checkpoint {record.tag} at {record.time}{commit}")
            if record.changed:
                lines.append(f"     {_changed_text(record.changed)}")
            if record.tag_missing:
                lines.append(f"     {_tag_missing_text(record.tag, record.commit)}")
        metrics, source = facts[phase.id].headline
        if metrics:
            lines.append(f"     {_metrics(plan, phase.id, metrics)}" + (f" ({source})" if record is None and source else ""))
        targets, source = facts[phase.id].targets
        if targets and record is not None:
            lines.append(f"     targets the checkpoint left open: {describe_targets(targets).partition('; open: ')[2]}")
        elif targets:
            lines.append(f"     targets: {describe_targets(targets)}")
    lines.append(f"next: {view.next_phase}" if view.next_phase else "every phase is complete")
    return "\n".join(lines)
