"""Which notifications a process listens to: all of them, or a worker's share."""

from __future__ import annotations

import asyncio

from psycopg import AsyncConnection

from server.events.channels import (
    CANCEL_CHANNEL,
    CHANNELS,
    EVENTS_CHANNEL,
    RUNS_CHANNEL,
    WORKER_CHANNELS,
)
from server.events.notify import Notifier


async def _heard(database_url: str, channels: tuple[str, ...]) -> list[str]:
    """Notify the events channel, then the runs channel; return the channels heard, in order."""
    notifier = Notifier(database_url, channels)
    heard: list[str] = []
    done = asyncio.Event()
    notifier.on(EVENTS_CHANNEL, lambda _p: heard.append(EVENTS_CHANNEL))

    def on_runs(payload: str) -> None:
        if payload == "queued":  # not the "look again" said once the listener is connected
            heard.append(RUNS_CHANNEL)
            done.set()

    notifier.on(RUNS_CHANNEL, on_runs)
    await notifier.start()
    try:
        with notifier.watch_run("run_x") as woken:
            # Postgres delivers one transaction's notifications in order: once the runs
            # channel is heard, an events notification would have been heard before it.
            async with (
                await AsyncConnection.connect(database_url, autocommit=True) as conn,
                conn.transaction(),
            ):
                await conn.execute("SELECT pg_notify(%s, 'run_x:5')", (EVENTS_CHANNEL,))
                await conn.execute("SELECT pg_notify(%s, 'queued')", (RUNS_CHANNEL,))
            async with asyncio.timeout(30):
                await done.wait()
            if woken.is_set():
                heard.append("watcher woken")
    finally:
        await notifier.stop()
    return heard


async def test_a_process_serving_streams_hears_the_event_log(database_url: str) -> None:
    heard = await _heard(database_url, CHANNELS)
    assert heard == [EVENTS_CHANNEL, RUNS_CHANNEL, "watcher woken"]


async def test_a_worker_only_process_does_not_listen_to_the_event_log(database_url: str) -> None:
    heard = await _heard(database_url, WORKER_CHANNELS)
    assert heard == [RUNS_CHANNEL]


def test_a_worker_still_hears_queued_runs_cancels_and_pauses() -> None:
    assert EVENTS_CHANNEL not in WORKER_CHANNELS
    assert set(WORKER_CHANNELS) == set(CHANNELS) - {EVENTS_CHANNEL}
    assert CANCEL_CHANNEL in WORKER_CHANNELS
