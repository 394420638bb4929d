"""A thread's join stream (`GET /threads/{id}/stream`): its runs' streams, one after another.

It starts with the run in progress (or the next one created), streams it as
`GET …/runs/{run_id}/stream` would, sends `run_done` when it ends, then follows the next
run of the thread, until the client leaves. Each frame's id is `<run_id>:<seq>` (`run_done`:
`<run_id>:end`), so `Last-Event-ID` resumes exactly after it, from the log.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from server.db.pool import Pool
from server.domain import TERMINAL, Run, parse_seq, status_in
from server.errors import InvalidGraphRequestError
from server.events.notify import Notifier
from server.langgraph_api.runs import INTERRUPTED, lg_status
from server.langgraph_api.stream import graph_stream, sse

THREAD_MODES = ("run_modes", "lifecycle")
# How often a thread with no run in progress is looked at for a new one.
NEXT_RUN_POLL_S = 0.5


def parse_cursor(last_event_id: str | None) -> tuple[str, int | None] | None:
    """Return `(run_id, seq)` of a thread stream's `Last-Event-ID` (seq None: after its end).

    Raises:
        InvalidGraphRequestError: the id is not one this stream sent.
    """
    if not last_event_id:
        return None
    run_id, _, text = last_event_id.rpartition(":")
    seq = parse_seq(text)
    if not run_id or (text != "end" and seq is None):
        raise InvalidGraphRequestError(
            f"Last-Event-ID {last_event_id!r} is not an id of this thread's stream"
            " ('<run_id>:<seq>' or '<run_id>:end')"
        )
    return run_id, seq


def thread_modes(requested: Sequence[str] | None) -> bool:
    """Say whether the run parts are wanted (`run_modes`) or only `lifecycle` frames.

    Raises:
        InvalidGraphRequestError: a mode this stream does not serve.
    """
    modes = requested or ["run_modes"]
    unknown = [m for m in modes if m not in THREAD_MODES]
    if unknown:
        raise InvalidGraphRequestError(
            f"thread stream modes {unknown} are not served; use {list(THREAD_MODES)}"
        )
    return "run_modes" in modes


async def _next_run(pool: Pool, thread_id: str, after: str | None) -> dict[str, Any] | None:
    """Return the thread's first run created after run `after` (None: its first run)."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT r.id FROM runs r WHERE r.conversation_id = %(t)s AND (%(a)s::text IS NULL"
            " OR (r.created_at, r.id) > (SELECT a.created_at, a.id FROM runs a WHERE a.id = %(a)s))"
            " ORDER BY r.created_at, r.id LIMIT 1",
            {"t": thread_id, "a": after},
        )
        return await cur.fetchone()


async def _joined_run(pool: Pool, thread_id: str) -> tuple[str | None, str | None]:
    """Return `(run to stream, run to follow)` for a new join.

    That is the oldest unfinished run, else the thread's newest run: only runs created after
    it are streamed.
    """
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT id FROM runs WHERE conversation_id = %s"
            f" AND NOT {status_in(TERMINAL)} ORDER BY created_at, id LIMIT 1",
            (thread_id,),
        )
        current = await cur.fetchone()
        if current is not None:
            return current["id"], None
        cur = await conn.execute(
            "SELECT id FROM runs WHERE conversation_id = %s ORDER BY created_at DESC, id DESC"
            " LIMIT 1",
            (thread_id,),
        )
        newest = await cur.fetchone()
    return None, newest["id"] if newest else None


async def _ended(pool: Pool, run_id: str) -> str:
    """Return the LangGraph status a run ended with."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            f"SELECT r.*, {INTERRUPTED} FROM runs r WHERE r.id = %s",
            (run_id,),
        )
        row = await cur.fetchone()
    return lg_status(Run.from_row(row), bool(row["interrupted"])) if row else "deleted"


async def thread_stream(
    pool: Pool,
    notifier: Notifier,
    thread_id: str,
    *,
    cursor: tuple[str, int | None] | None,
    parts: bool,
    heartbeat_s: float,
    stop: asyncio.Event | None = None,
) -> AsyncIterator[str]:
    """Yield the thread's runs' streams after `cursor`, each closed by `run_done`."""
    after: int | None = None
    if cursor is None:
        current, previous = await _joined_run(pool, thread_id)
    else:
        current, after = cursor
        previous = None
        if after is None:  # that run is done: go on with the next one
            previous, current = current, None
    waited = 0.0
    while stop is None or not stop.is_set():
        if current is None:
            found = await _next_run(pool, thread_id, previous)
            if found is None:
                sleep = min(NEXT_RUN_POLL_S, heartbeat_s)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for((stop or asyncio.Event()).wait(), sleep)
                waited += sleep
                if waited >= heartbeat_s:
                    waited = 0.0
                    yield ": heartbeat\n\n"
                continue
            current, after = found["id"], None
        frames = graph_stream(
            pool,
            notifier,
            current,
            after=after,
            modes=None,
            heartbeat_s=heartbeat_s,
            stop=stop,
            id_prefix=f"{current}:",
        )
        async for frame in frames:
            if parts or frame.startswith(":") or "\nevent: metadata\n" in f"\n{frame}":
                yield frame
        if stop is not None and stop.is_set():
            return
        status = await _ended(pool, current)
        yield sse("run_done", {"run_id": current, "status": status}, f"{current}:end")
        previous, current, after = current, None, None
