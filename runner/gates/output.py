"""Read what a gate left behind (metrics, progress, the callable child's status) without trusting it.

The files are the gate's to write, so every read goes through ``runner.untrusted`` (bounded, no
FIFOs or links, JSON with limits); nothing here blocks or raises for any file content.
"""

from __future__ import annotations

from collections.abc import Container
from pathlib import Path
from typing import Any

from runner.protocol import MAX_METRICS_BYTES
from runner.untrusted import UntrustedFileError, parse_json, read_bounded

MAX_PROGRESS_TAIL_BYTES = 4096
MAX_STATUS_BYTES = 64 << 10


def read_json(path: Path, limit: int = MAX_METRICS_BYTES, *, what: str = "file") -> tuple[Any, str | None]:
    """``(value, None)``; ``(None, None)`` when the file does not exist; ``(None, reason)``
    when it cannot be used."""
    try:
        data = read_bounded(path, limit, what=what)
        if data is None:
            return None, None
        return parse_json(data, what=what), None
    except UntrustedFileError as exc:
        return None, str(exc)


def read_progress(path: Path) -> tuple[int | None, int | None]:
    """The last well-formed ``{"done": n, "total": m}`` line in the last bytes of ``path``;
    ``(None, None)`` for anything else (missing, FIFO, link, garbage). Never blocks."""
    try:
        data = read_bounded(path, MAX_PROGRESS_TAIL_BYTES, what="progress file", tail=True)
    except UntrustedFileError:
        return None, None
    if not data:
        return None, None
    for line in reversed(data.decode("utf-8", errors="replace").splitlines()):
        try:
            value = parse_json(line, what="progress line", max_depth=4)
        except UntrustedFileError:
            continue
        if isinstance(value, dict):
            done, total = value.get("done"), value.get("total")
            if _plain_int(done):
                return done, total if _plain_int(total) else None
    return None, None


def _plain_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)



def read_status(path: Path, valid: Container[str]) -> tuple[str, str] | None:
    """The ``(status, message)`` a ``call:`` gate's child wrote to ``path`` (``status`` one of
    ``valid``), or ``None`` when it wrote none or anything else (a FIFO, a link, garbage, a
    huge file): the verdict then rests on the exit status. Never blocks."""
    data, problem = read_json(path, MAX_STATUS_BYTES, what="status file")
    if problem is not None or not isinstance(data, dict):
        return None
    status = data.get("status")
    if not isinstance(status, str) or status not in valid:
        return None
    return status, one_line_text(data.get("message", ""))[:4000]


def one_line_text(value: object) -> str:
    """``str(value)``; a non-string is written as JSON-ish text, never raising."""
    try:
        return value if isinstance(value, str) else repr(value)
    except Exception:  # noqa: BLE001 - a hostile __repr__ cannot exist in parsed JSON, but be safe
        return "<unprintable>"
