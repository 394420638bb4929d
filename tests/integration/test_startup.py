"""Processes starting together on a fresh database migrate and set up the checkpointer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from server.db.pool import migrate, open_pool
from server.process import setup_checkpointer
from server.settings import Settings
from tests.support.postgres import create_database, drop_database


@pytest.fixture
def fresh_url(pg_admin_url: str) -> Iterator[str]:
    url = create_database(pg_admin_url, "startup")
    yield url
    drop_database(pg_admin_url, url)


async def test_concurrent_start_ups_on_a_fresh_database_all_finish(
    fresh_url: str, settings: Settings
) -> None:
    async def start() -> None:
        async with open_pool(fresh_url, settings) as pool:
            await migrate(pool)
            await setup_checkpointer(pool)

    async with asyncio.timeout(60):
        await asyncio.gather(*(start() for _ in range(4)))
