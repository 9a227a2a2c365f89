"""``runner init``: write a new plan from the plan template."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from runner.cli._common import domain_errors
from runner.plan.scaffold import DEFAULT_PHASES, init_plan
from runner.workspace import find_repo_root


def init(
    path: Annotated[Path, typer.Argument(help="The new plan file (.md); never overwritten.")],
    phases: Annotated[
        str, typer.Option("--phases", help="Comma-separated phase ids, in the order they run.")
    ] = ",".join(DEFAULT_PHASES),
    plan_id: Annotated[
        str | None, typer.Option("--id", help="Plan id (used in tags and report paths; default: the file name).")
    ] = None,
    title: Annotated[str | None, typer.Option("--title", help="Plan title (default: the id).")] = None,
) -> None:
    """Write a new plan with one placeholder gate per phase, valid as written.

    The placeholder gates fail until replaced, so no phase can be checkpointed by accident.
    Refuses (exit 2) when PATH already exists.
    """
    with domain_errors():
        doc = init_plan(path, phases=phases.split(","), plan_id=plan_id, title=title, shown_as=_from_root(path))
    ids = ", ".join(phase.id for phase in doc.plan.phases)
    typer.echo(f"plan {doc.plan.id} written to {path} (phases: {ids}); check it with `runner status --plan {path}`")


def _from_root(path: Path) -> str:
    """How the plan names itself in its placeholders: from the repository's root
    (``plans/demo.md``), else as given."""
    root = find_repo_root(path.parent)
    try:
        return path.resolve().relative_to(root).as_posix()
    except ValueError:
        return str(path)
