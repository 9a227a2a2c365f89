"""How values read in text: metrics, Markdown table cells, aligned columns, short fingerprints.

Pure functions shared by the reports, the plan's status section, the commit message and the
command output, so one value reads the same everywhere.
"""

from __future__ import annotations


def format_metric(value: object, digits: int = 4) -> str:
    """A metric as text: floats to ``digits`` significant digits (``.4g``), anything else as ``str``."""
    if isinstance(value, float):
        return format(value, f".{digits}g")
    return str(value)


def table_cell(value: object) -> str:
    """A value made safe for one Markdown table cell (one line, ``|`` escaped)."""
    return " ".join(str(value).split()).replace("|", "\\|")


MARKDOWN_FILTERS = {"cell": table_cell, "metric": format_metric}
"""The jinja2 filters of the Markdown templates."""


def short(fingerprint: str) -> str:
    """The first 8 hex digits of a ``sha256:`` fingerprint."""
    return fingerprint.split(":", 1)[-1][:8]


def text_columns(rows: list[tuple[str, ...]]) -> list[str]:
    """``rows`` as lines of left-aligned columns, indented by two spaces."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
