"""How the API and the events write a time (ISO 8601 with its UTC offset), and read one."""

from __future__ import annotations

import re
from datetime import date, datetime
from typing import Annotated, Any

from pydantic import BeforeValidator

_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _iso_only(value: Any) -> Any:
    if isinstance(value, int | float) or (isinstance(value, str) and _NUMBER.fullmatch(value)):
        raise ValueError(f"{value!r} is a number; send ISO 8601: 2026-12-01, 2026-12-01T08:00Z")
    return value


IsoTime = Annotated[datetime, BeforeValidator(_iso_only)]
"""A time in input, as ISO 8601 text (the schema's `date-time`), not as the Unix timestamp
pydantic would also take."""
IsoDate = Annotated[date, BeforeValidator(_iso_only)]
"""A day in input, as ISO 8601 text (`2026-12-01`), not as a Unix timestamp."""


def iso(value: datetime | None) -> str | None:
    """Return `value` in ISO 8601 (None stays None)."""
    return value.isoformat() if value else None
