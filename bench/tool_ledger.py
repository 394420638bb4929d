"""Print the tool pipeline's per-call overhead, in memory and with the Postgres ledger.

Usage: .venv/bin/python -m bench.tool_ledger [--calls 500]
Uses DATABASE_URL, or a throwaway embedded Postgres.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import tempfile
import time
from pathlib import Path

import psycopg

from server.auth import Principal
from server.db.pool import migrate, open_pool
from server.runs.conversations import create_conversation
from server.runs.records import create_run
from server.settings import Settings
from tools.ledger import InMemoryToolLedger, PostgresToolLedger, ToolLedger
from tools.pipeline import claim, execute
from tools.policy import Toolbox, prepare
from tools.spec import agent_tool


@agent_tool
async def noop(x: int) -> str:
    """Do nothing.

    Args:
        x: Ignored.
    """
    return "ok"


def database_url() -> str:
    """Return the database URL from the environment or start the embedded server."""
    admin = os.environ.get("DATABASE_URL")
    if admin is None:
        import pgserver  # type: ignore[import-untyped,unused-ignore]

        server = pgserver.get_server(Path(tempfile.mkdtemp()) / "pg", cleanup_mode="stop")
        admin = str(server.get_uri())
    name = f"bench_{secrets.token_hex(4)}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return str(psycopg.conninfo.make_conninfo(admin, dbname=name))


async def main(calls: int) -> None:
    """Time `calls` ledgered tool calls against a fresh database."""
    url = database_url()
    settings = Settings(_env_file=None, DATABASE_URL=url)  # type: ignore[call-arg]
    async with open_pool(url, settings) as pool:
        await migrate(pool)
        who = Principal("bench", "bench", frozenset())
        conv = await create_conversation(pool, who, None, None, {})
        run = await create_run(pool, who, conv["id"], "x", "demo", {})
        ledgers: list[tuple[str, ToolLedger]] = [
            ("in-memory ledger", InMemoryToolLedger()),
            ("postgres ledger", PostgresToolLedger(pool, "bench")),
        ]
        for name, ledger in ledgers:
            box = Toolbox.of([noop], run_id=run.id, ledger=ledger)
            began = time.perf_counter()
            for i in range(calls):
                call = prepare(box, f"{name}-{i}", "noop", {"x": i})
                await claim(box, call)
                await execute(box, call, lambda _event: None)
            per_call = (time.perf_counter() - began) / calls * 1000
            print(f"{name}: {per_call:.3f} ms per call (checks, claim, execute, record), n={calls}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=500)
    asyncio.run(main(parser.parse_args().calls))
