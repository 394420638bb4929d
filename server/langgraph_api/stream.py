"""LangGraph's SSE over agentrt's durable event log.

A run's `graph.chunk` events are its stream parts, so every stream can be joined or resumed
with `Last-Event-ID` (the event's seq) at any time, during the run and after it: replay from
the log, then follow it live. The first frame of a new stream is `metadata`; a failed run
ends with `error`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from graphs.events import TERMINAL_EVENTS, EventType
from server import jsontext
from server.db.pool import Pool
from server.domain import is_terminal
from server.events.log import read_events
from server.events.notify import Notifier


def sse(event: str, data: object, seq: int | str | None = None) -> str:
    """Format one SSE frame with an optional `id`."""
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {event}\ndata: {jsontext.dumps(data)}\n\n"


async def graph_stream(
    pool: Pool,
    notifier: Notifier,
    run_id: str,
    *,
    after: int | None,
    modes: set[str] | None,
    heartbeat_s: float,
    attempt: int = 1,
    page: int = 1000,
    stop: asyncio.Event | None = None,
    id_prefix: str = "",
) -> AsyncIterator[str]:
    """Yield the run's stream after event `after` (from the start with `metadata` if None).

    Each frame's id is its seq after `id_prefix` (a thread's stream names the run there).
    """
    if after is None:
        yield sse("metadata", {"run_id": run_id, "attempt": attempt})
    cursor = after or 0
    with notifier.watch_run(run_id) as wake:
        while stop is None or not stop.is_set():
            wake.clear()  # before reading, so a commit during the read is not missed
            async with pool.connection() as conn:
                rows = await read_events(conn, run_id, cursor, page)
                if not rows:
                    cur = await conn.execute(
                        "SELECT status, last_event_seq, events_expired_at FROM runs WHERE id = %s",
                        (run_id,),
                    )
                    run = await cur.fetchone()
                    # Over only if nothing is left to read: the run may have ended with
                    # events committed between the two reads (their notification has woken
                    # `wake`, so the next read comes at once). An expired log has none left.
                    if (
                        run is None
                        or run["events_expired_at"] is not None
                        or (is_terminal(run["status"]) and cursor >= run["last_event_seq"])
                    ):
                        return
            for seq, kind, wire in rows:
                cursor = seq
                if kind == EventType.GRAPH_CHUNK:
                    chunk = json.loads(wire)["data"]
                    if modes is None or chunk["mode"] in modes:
                        name = chunk["mode"] + (f"|{chunk['ns']}" if chunk["ns"] else "")
                        yield sse(name, chunk["data"], f"{id_prefix}{seq}")
                elif kind == EventType.RUN_FAILED:
                    data = json.loads(wire)["data"]
                    error = {"error": data.get("errorType"), "message": data.get("message")}
                    yield sse("error", error, f"{id_prefix}{seq}")
                    return
                elif kind in TERMINAL_EVENTS:
                    return
            if rows:
                continue
            try:
                await asyncio.wait_for(wake.wait(), heartbeat_s)
            except TimeoutError:
                yield ": heartbeat\n\n"
