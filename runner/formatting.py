"""How values read in text: metrics, Markdown table cells, aligned columns, short fingerprints.

Pure functions shared by the reports, the plan's status section, the commit message and the
command output, so one value reads the same everywhere.
"""

from __future__ import annotations

import json
import math
import re
import statistics

CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""Characters that end a line or steer a terminal: C0 and C1 controls, DEL, the Unicode line
and paragraph separators."""


def format_metric(value: object, digits: int = 4) -> str:
    """A metric as text: floats to ``digits`` significant digits (``.4g``), samples (a list of
    numbers) as their median and count (``2.31 (median of 20)``), anything else as ``str`` on
    one line (``one_line``: a string a gate reported cannot steer a terminal)."""
    if isinstance(value, float):
        return format(value, f".{digits}g")
    if isinstance(value, list) and value and all(
        isinstance(item, (int, float)) and not isinstance(item, bool) and math.isfinite(item) for item in value
    ):
        return f"{format_metric(float(statistics.median(value)), digits)} (median of {len(value)})"
    return one_line(value)


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


def one_line(text: object) -> str:
    """``text`` on one line: CR, LF, other control characters and Unicode line separators
    are written as ``\\n``-style escapes, lone surrogates as ``\\udXXX``; a backslash stays.
    What a commit message, a trailer or a terminal line gets from data the runner did not write."""
    value = str(text)

    def escape(match: re.Match[str]) -> str:
        char = match.group(0)
        named = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char)
        return named or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")

    value = CONTROL_CHARS.sub(escape, value)
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def json_text(data: object) -> str:
    """``data`` as indented JSON that any parser reads: a NaN or infinite float (a metric that
    measured nothing) is written as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``,
    not as the bare tokens Python's ``json`` would write, which JSON does not have."""
    return json.dumps(_finite(data), indent=2, allow_nan=False)


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value
