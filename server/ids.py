"""Identifiers: a type prefix, then a time-ordered, random hex body (sorts by creation)."""

from __future__ import annotations

import secrets
import threading
import time

_RANDOM_BITS = 80
_lock = threading.Lock()
_last = (0, 0)  # the (millisecond, random part) of this process's latest id


def new_id(prefix: str) -> str:
    """Return an id such as `run_0192f3a4b5c6d7e8f9a0b1c2d3e4f5a6`.

    Ids made by one process sort in the order they were made, even within one millisecond
    (the random part is then the previous one plus one, as in monotonic ULIDs): two children
    a parent starts in one transaction list in the order it started them.
    """
    global _last
    with _lock:
        millis, tail = time.time_ns() // 1_000_000, secrets.randbits(_RANDOM_BITS)
        last_millis, last_tail = _last
        if millis <= last_millis:
            millis, tail = last_millis, last_tail + 1
            if tail >= 1 << _RANDOM_BITS:  # spent within one millisecond: borrow the next
                millis, tail = millis + 1, 0
        _last = (millis, tail)
    return f"{prefix}_{millis:012x}{tail:020x}"
