"""Tools for tests: a side effect whose count can be checked from outside the process."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tools.spec import CallContext, agent_tool


@agent_tool(idempotent=False, dedupes=True)
async def bump_counter(path: str, call: CallContext, hold_s: float = 0.0) -> str:
    """Add one to the counter kept in the file at `path`, then wait `hold_s` seconds.

    The "outside system" is the file: one line per request, tagged with the idempotency key,
    and it counts distinct keys, so a repeated request with the same key is not counted twice.

    Args:
        path: The counter file.
        hold_s: Seconds to wait after the side effect, before returning.
    """
    counter = Path(path)
    await asyncio.to_thread(_append, counter, f"bump {call.idempotency_key}\n")
    lines = (await asyncio.to_thread(counter.read_text)).splitlines()
    await asyncio.sleep(hold_s)
    return f"counter is now {len(set(lines))}"


def _append(path: Path, line: str) -> None:
    with path.open("a") as f:
        f.write(line)


@agent_tool(risk="high")
async def launch_rocket(target: str) -> str:
    """Launch the rocket at a target (needs a human's approval).

    Args:
        target: Where to.
    """
    return f"launched towards {target}"
