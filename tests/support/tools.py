"""Tools for tests: a side effect whose count can be checked from outside the process."""

from __future__ import annotations

import time
from pathlib import Path

from langchain_core.tools import tool


@tool
def bump_counter(path: str, hold_s: float = 0.0) -> str:
    """Add one to the counter kept in the file at `path`, then wait `hold_s` seconds.

    Args:
        path: The counter file; one line is appended per call.
        hold_s: Seconds to wait after the side effect, before returning.
    """
    counter = Path(path)
    with counter.open("a") as f:
        f.write("bump\n")
    count = len(counter.read_text().splitlines())
    time.sleep(hold_s)
    return f"counter is now {count}"
