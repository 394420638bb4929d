"""How the API and the events write a time: ISO 8601 with its UTC offset."""

from __future__ import annotations

from datetime import datetime


def iso(value: datetime | None) -> str | None:
    """Return `value` in ISO 8601 (None stays None)."""
    return value.isoformat() if value else None
