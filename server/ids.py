"""Identifiers: a type prefix, then a time-ordered, random hex body (sorts by creation)."""

from __future__ import annotations

import secrets
import time


def new_id(prefix: str) -> str:
    """Return an id such as `run_0192f3a4b5c6d7e8f9a0b1c2d3e4f5a6`."""
    return f"{prefix}_{time.time_ns() // 1_000_000:012x}{secrets.token_hex(10)}"
