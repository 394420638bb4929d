"""Shared fixtures: one real Postgres server per session, a fresh database per test module."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from server.db.pool import Pool, migrate, open_pool
from server.process import setup_checkpointer
from server.settings import Settings
from tests.support.postgres import create_database, drop_database, server_url, stop_server


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """The admin URL of the test Postgres server.

    Its data lives in a folder of its own, not under pytest's temporary root, which pytest
    prunes when other sessions start (several suites may run at once on one machine).
    """
    folder = Path(tempfile.mkdtemp(prefix="agentrt-pg-"))
    try:
        yield server_url(folder, os.environ.get("DATABASE_URL"))
    finally:
        stop_server(folder)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def database_url(pg_admin_url: str) -> Iterator[str]:
    """A fresh, empty database for this test module."""
    url = create_database(pg_admin_url)
    yield url
    drop_database(pg_admin_url, url)


@pytest.fixture(scope="module")
def settings(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Settings for an app on the module's database, with quick timings for tests."""
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        environment="test",
        DATABASE_URL=database_url,
        data_dir=Path(tmp_path_factory.mktemp("data")),
        demo_token_delay_ms=0,
        sse_heartbeat_s=1.0,
        lease_seconds=5.0,
        worker_poll_seconds=1.0,
    )


@pytest.fixture(scope="module")
async def pool(settings: Settings, database_url: str) -> AsyncIterator[Pool]:
    """A migrated connection pool on the module's database, LangGraph's checkpoint tables too.

    Every process that runs runs creates those at start; a run's claim reads them.
    """
    async with open_pool(database_url, settings) as p:
        await migrate(p)
        await setup_checkpointer(p)
        yield p
