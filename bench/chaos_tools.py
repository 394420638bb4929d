"""The chaos run's side effect: a charge recorded in a file outside the run's transactions."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tools.spec import CallContext, agent_tool


@agent_tool(idempotent=False, dedupes=True)
async def charge(path: str, call: CallContext, hold_s: float = 0.0) -> str:
    """Charge the customer once, then wait `hold_s` seconds.

    The outside system is the file: one line per request, naming the run and the request's
    idempotency key. It dedupes on the key, so a run charged under two keys paid twice.

    Args:
        path: The ledger file of the outside system.
        call: The call's context; its idempotency key names the request.
        hold_s: Seconds to wait after charging, before answering.
    """
    line = f"{call.run_id} {call.idempotency_key}\n"
    await asyncio.to_thread(_append, Path(path), line)
    await asyncio.sleep(hold_s)
    return "charged"


def _append(path: Path, line: str) -> None:
    with path.open("a") as f:
        f.write(line)
