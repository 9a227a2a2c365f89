"""The jinja2 environment every runner template renders in (``runner/templates/``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jinja2


def template_env(
    *, html: bool = False, filters: Mapping[str, Callable[..., object]] | None = None
) -> jinja2.Environment:
    """An environment over ``runner/templates`` that fails on undefined names.

    ``html`` turns on autoescaping (the HTML report); Markdown and YAML templates render raw.
    ``filters`` are added to jinja2's own.
    """
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("runner", "templates"),
        autoescape=html,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(filters or {})
    return env
