"""``runner init``: write a new plan from ``runner/templates/plan.md.j2``, valid as written.

The plan gets one placeholder gate per phase that fails until it is replaced, so nothing can be
checkpointed by accident. An existing file is never overwritten.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from runner.errors import UsageError
from runner.plan.load import PlanDocument, load_plan
from runner.plan.schema import ID_PATTERN, ID_RULE
from runner.templating import template_env

TEMPLATE = "plan.md.j2"
DEFAULT_PHASES = ("first",)

_ID = re.compile(ID_PATTERN)


def render_plan(*, plan_id: str, title: str, phases: Sequence[str], path_name: str) -> str:
    """The text of a new Markdown plan; ``path_name`` is how its placeholder gates name it."""
    env = template_env(filters={"yaml": lambda value: json.dumps(value, ensure_ascii=False)})
    placeholders = {
        phase: f"echo {shlex.quote(f'phase {phase} has no real gate yet: edit {path_name}')} >&2; exit 1"
        for phase in phases
    }
    return env.get_template(TEMPLATE).render(
        plan_id=plan_id, title=title, phases=list(phases), placeholders=placeholders
    )


def init_plan(
    path: Path, *, phases: Sequence[str] = DEFAULT_PHASES, plan_id: str | None = None,
    title: str | None = None, shown_as: str | None = None,
) -> PlanDocument:
    """Write a new plan at ``path`` and return it as loaded.

    ``plan_id`` defaults to the file name without its suffix; ``title`` to the id;
    ``shown_as`` (how the placeholder gates name the file, ``plans/demo.md``) to ``path``.
    Raises ``UsageError`` when ``path`` exists, is not a ``.md`` file, or an id is not valid.
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
            raise UsageError(f"{what} {value!r} is not valid: use {ID_RULE}")
    repeated = sorted({phase for phase in phases if phases.count(phase) > 1})
    if repeated:
        raise UsageError(f"phase ids must be unique; repeated: {', '.join(repeated)}")
    text = render_plan(plan_id=plan_id, title=title or plan_id, phases=phases, path_name=shown_as or str(path))
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError("--title holds bytes that are not UTF-8 (a lone surrogate); give the title as UTF-8 text") from None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot make the folder {path.parent} for the plan: {exc.strerror or exc} "
                         "(a file in the way?)") from None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise UsageError(f"{path} already exists; runner init never overwrites a file") from None
    except OSError as exc:
        raise UsageError(f"cannot create {path}: {exc.strerror or exc}") from None
    try:  # nothing half-written stays behind: a retry must not find a file that "exists"
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        return load_plan(path)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
