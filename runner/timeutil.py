"""UTC time, the one clock of the runner, and its two text forms.

``iso_ms`` (milliseconds) stamps when a gate started; ``iso_time`` (seconds) stamps a run and
a checkpoint. Both end in ``Z``.
"""

from __future__ import annotations

from datetime import datetime, timezone


def utc_now() -> datetime:
    """The current time, timezone-aware, in UTC."""
    return datetime.now(timezone.utc)


def iso_time(moment: datetime) -> str:
    """``2026-11-29T23:50:00Z``."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_ms(moment: datetime | None = None) -> str:
    """``2026-11-29T23:50:00.123Z`` (now when ``moment`` is ``None``)."""
    moment = moment or utc_now()
    return moment.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
