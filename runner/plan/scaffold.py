"""``runner init``: write a new plan from ``runner/templates/plan.md.j2``, valid as written.

The plan gets one placeholder gate per phase that fails until it is replaced, so nothing can be
checkpointed by accident. An existing file is never overwritten.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

from runner.errors import PlanError, UsageError
from runner.plan.load import PlanDocument, load_plan
from runner.plan.schema import ID_PATTERN
from runner.templating import template_env

TEMPLATE = "plan.md.j2"
DEFAULT_PHASES = ("first",)

_ID = re.compile(ID_PATTERN)


def render_plan(*, plan_id: str, title: str, phases: Sequence[str], path_name: str) -> str:
    """The text of a new Markdown plan."""
    env = template_env(filters={"yaml": lambda value: json.dumps(value, ensure_ascii=False)})
    return env.get_template(TEMPLATE).render(
        plan_id=plan_id, title=title, phases=list(phases), path_name=path_name
    )


def init_plan(
    path: Path, *, phases: Sequence[str] = DEFAULT_PHASES, plan_id: str | None = None,
    title: str | None = None,
) -> PlanDocument:
    """Write a new plan at ``path`` and return it as loaded.

    ``plan_id`` defaults to the file name without its suffix; ``title`` to the id. Raises
    ``UsageError`` when ``path`` exists, is not a ``.md`` file, or an id is not valid.
    """
    path = Path(path)
    if path.suffix.lower() != ".md":
        raise UsageError(f"{path}: a new plan is a Markdown file; give a path ending in .md")
    plan_id = plan_id or path.stem
    phases = [phase.strip() for phase in phases if phase.strip()]
    if not phases:
        raise UsageError("--phases names no phase; give ids like build,verify,bench")
    for what, value in [("plan id", plan_id), *(("phase id", phase) for phase in phases)]:
        if not _ID.fullmatch(value):
            raise UsageError(
                f"{what} {value!r} is not valid: use letters, digits, '.', '_' and '-', "
                "starting with a letter or digit"
            )
    repeated = sorted({phase for phase in phases if phases.count(phase) > 1})
    if repeated:
        raise UsageError(f"phase ids must be unique; repeated: {', '.join(repeated)}")
    text = render_plan(plan_id=plan_id, title=title or plan_id, phases=phases, path_name=path.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise UsageError(f"{path} already exists; runner init never overwrites a file") from None
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    try:
        return load_plan(path)
    except PlanError:
        path.unlink()
        raise
