"""Database access: the embedded server, the one connection pool, and schema migrations."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import select
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any, TypeVar

from psycopg import AsyncConnection, Error, OperationalError, errors
from psycopg.pq import PipelineStatus, TransactionStatus
from psycopg.rows import dict_row
from psycopg.types.json import set_json_dumps
from psycopg_pool import AsyncConnectionPool

from server import jsontext
from server.settings import Settings

log = logging.getLogger(__name__)

# Any constant works; it only has to be the same in every process that migrates.
_MIGRATION_LOCK = 7_262_616_001

# A connection whose rows are dicts, as every query of ours reads them.
Conn = AsyncConnection[dict[str, Any]]
Pool = AsyncConnectionPool[Conn]
T = TypeVar("T")
_DEADLOCK_TRIES = 5


@asynccontextmanager
async def database_url(settings: Settings) -> AsyncIterator[str]:
    """Yield `DATABASE_URL`, or start (or join) the embedded PostgreSQL and yield its URL.

    The embedded server keeps its data in `settings.data_dir / "pg"`, so runs survive restarts,
    and is shared by every agentrt process on that folder (API, workers, CLI); the last of them
    to exit stops it (server/db/embedded.py).
    """
    if settings.database_url:
        yield settings.database_url
        return
    from server.db import embedded  # only the embedded mode needs pgserver

    url = await asyncio.to_thread(embedded.start, settings.data_dir)
    try:
        yield url
    finally:
        await asyncio.to_thread(embedded.release, settings.data_dir)


CONNECT_TIMEOUT_S = 5
RECONNECT_TIMEOUT_S = 10.0


def connection_kwargs() -> dict[str, Any]:
    """Connection options shared by our code and the LangGraph checkpointer."""
    return {
        "autocommit": True,
        "prepare_threshold": 0,
        "row_factory": dict_row,
        # A connection attempt to a database mid-restart must fail, not hang the pool's refill.
        "connect_timeout": CONNECT_TIMEOUT_S,
    }


async def configure_connection(conn: Conn) -> None:
    """Session settings for every pooled connection.

    Our queries are short and indexed; a parallel plan starts worker processes that cost more
    than they save, and lures the planner into scanning whole tables (a memory recall took a
    parallel scan of every stored memory, four times slower than its index scan).
    Before pgvector 0.8, or without pgvector, `hnsw.*` is an unused placeholder.
    `Jsonb` and `Json` parameters are written by orjson (server/jsontext.py), a NUL character
    in them as U+FFFD (`jsonb` refuses it).
    """
    set_json_dumps(jsontext.stored_bytes, conn)
    await conn.execute("SET max_parallel_workers_per_gather = 0")
    # A filtered HNSW search (one user's memories, one tenant's chunks) otherwise stops at the
    # index's first `ef_search` neighbours, most of them filtered out: too few results.
    try:
        await conn.execute("SET hnsw.iterative_scan = strict_order")
    except errors.Error:
        # A pgvector before 0.8 preloaded by the server reserves `hnsw.*` and refuses it.
        log.info("this database's pgvector has no iterative HNSW scans (pgvector 0.8+)")


async def check_connection(conn: Conn) -> None:
    """Check a pooled connection before it is handed out; raise if it is unusable.

    A server that restarts, or ends a backend, sends a FATAL message and closes the socket,
    so a healthy idle connection has nothing to read. Only one with unread bytes (or an
    end of file) pays psycopg_pool's round-trip check (docs/decisions/1901).
    """
    if conn.closed or conn.broken:
        raise OperationalError("the pooled connection is closed")
    # poll, not select: select refuses descriptors above 1023, common in a busy server.
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    if poller.poll(0):
        await AsyncConnectionPool.check_connection(conn)


class _SweepingCheck:
    """The pool's checkout check (`check_connection`); a dead connection sweeps the others.

    A Postgres restart kills every pooled connection at once. psycopg_pool tries the next idle
    one after each failed check, waiting 1, 2, 4, 8 ... s in between, so a request behind ten
    dead connections times out before it reaches a live one, and the next request meets the
    rest: a quiet API answered 503 for a minute after one restart, and for as long as restarts
    came every few seconds (docs/decisions/2008). The first dead connection found starts one
    `pool.check()`, which replaces every dead idle connection while the request waits its
    first second; the request then gets a live one.
    """

    def __init__(self) -> None:
        self.pool: Pool | None = None
        self._sweep: asyncio.Task[None] | None = None

    async def __call__(self, conn: Conn) -> None:
        try:
            await check_connection(conn)
        except Exception:
            self._start_sweep()
            raise

    def _start_sweep(self) -> None:
        if self.pool is None or (self._sweep is not None and not self._sweep.done()):
            return
        self._sweep = asyncio.create_task(self._run(self.pool), name="agentrt-pool-sweep")

    @staticmethod
    async def _run(pool: Pool) -> None:
        log.info("a pooled connection was dead; checking the other idle ones")
        try:
            await pool.check()
        except Exception as exc:  # the pool is closing, or the database went away again
            log.warning("checking the pooled connections failed: %s", exc)

    async def stop(self) -> None:
        """Cancel a sweep under way (the pool is closing)."""
        if self._sweep is not None and not self._sweep.done():
            self._sweep.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweep


@asynccontextmanager
async def open_pool(url: str, settings: Settings) -> AsyncIterator[Pool]:
    """Open the process-wide connection pool."""
    check = _SweepingCheck()
    pool: Pool = AsyncConnectionPool(
        url,
        min_size=settings.db_pool_min,
        max_size=settings.db_pool_max,
        kwargs=connection_kwargs(),
        configure=configure_connection,
        open=False,
        name="agentrt",
        # After a database restart, pooled connections are dead; check each one handed out.
        check=check,
        timeout=settings.db_pool_timeout_s,
        # psycopg_pool backs off exponentially (1, 2, 4, ... s) until `reconnect_timeout`, and
        # grows no further meanwhile: a database that flapped could leave the pool empty for
        # minutes after it came back. Give up early; the next waiting request grows it anew.
        reconnect_timeout=RECONNECT_TIMEOUT_S,
    )
    check.pool = pool
    await pool.open(wait=True, timeout=30)
    try:
        yield pool
    finally:
        await check.stop()
        await pool.close()


def _migration_files() -> list[tuple[int, str, str]]:
    folder = resources.files("server.db") / "migrations"
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            version = int(entry.name.split("_", 1)[0])
            found.append((version, entry.name, entry.read_text(encoding="utf-8")))
    return sorted(found)


@asynccontextmanager
async def migration_lock(pool: Pool) -> AsyncIterator[AsyncConnection[dict[str, Any]]]:
    """Hold the migration advisory lock, so concurrent start-ups (API, workers) are safe.

    Waits by polling `pg_try_advisory_lock`, not by blocking in `pg_advisory_lock`: a session
    blocked in a statement holds a snapshot, and the checkpointer's `CREATE INDEX
    CONCURRENTLY` (run by the lock holder) waits for every such snapshot, a deadlock
    Postgres does not detect (docs/decisions/0601-startup-lock-polling.md).
    """
    async with pool.connection() as conn:
        while True:
            cur = await conn.execute("SELECT pg_try_advisory_lock(%s) AS got", (_MIGRATION_LOCK,))
            row = await cur.fetchone()
            if row is not None and row["got"]:
                break
            await asyncio.sleep(0.05)
        try:
            yield conn
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))


async def migrate(pool: Pool) -> list[str]:
    """Apply pending migrations in order, each in its own transaction; return the applied names."""
    applied: list[str] = []
    async with migration_lock(pool) as conn:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        cur = await conn.execute("SELECT version FROM schema_migrations")
        done = {row["version"] for row in await cur.fetchall()}
        for version, name, sql in _migration_files():
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(sql.encode(), prepare=False)  # many statements
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                    (version, name),
                )
            log.info("applied migration %s", name)
            applied.append(name)
    return applied


@asynccontextmanager
async def pipelined_transaction(conn: Conn) -> AsyncIterator[Conn]:
    """One transaction on a pipelined pooled connection: `BEGIN` and `COMMIT` as statements.

    `BEGIN` goes out with the block's first statement whose result is read, and `COMMIT`
    with every statement still unread at the end, in one round trip. psycopg's
    `transaction()` inside `pipeline()` syncs on its own at each end: four round trips where
    two do (docs/decisions/2011). Results left unread in the block can be read once it ends.

    A failure anywhere (in the block, or a statement's error met at the final sync, when
    `COMMIT` is skipped) rolls the transaction back through `conn.rollback()`: a `ROLLBACK`
    statement in a pipeline leaves psycopg's cache of prepared statements out of step with
    the server's. psycopg knows nothing of this transaction, and in a pipeline libpq knows
    its status only at a sync: inside the block, code must not call `conn.transaction()`,
    which could take it for none and commit it (`append_events` does not).
    """
    if (
        conn.info.pipeline_status != PipelineStatus.OFF
        or conn.info.transaction_status != TransactionStatus.IDLE
    ):
        raise RuntimeError("a pipelined transaction needs an idle connection, not pipelined")
    try:
        async with conn.pipeline():
            await conn.execute("BEGIN", prepare=False)
            yield conn
            await conn.execute("COMMIT", prepare=False)
    except BaseException:
        if conn.info.transaction_status in (
            TransactionStatus.INTRANS,
            TransactionStatus.INERROR,
        ):
            with contextlib.suppress(Error):
                await conn.rollback()
        raise


async def retry_deadlocks(attempt: Callable[[], Awaitable[T]]) -> T:
    """Run `attempt` (one whole transaction) again when Postgres aborted it to break a deadlock.

    The lock order makes deadlocks unlikely, not impossible (foreign-key checks take locks
    too), and an aborted transaction left nothing behind, so running it again is safe.
    """
    for tries in range(1, _DEADLOCK_TRIES + 1):
        try:
            return await attempt()
        except (errors.DeadlockDetected, errors.SerializationFailure):
            if tries == _DEADLOCK_TRIES:
                raise
            log.warning("transaction aborted by a deadlock; trying again (%d)", tries)
            # Jittered, so that the transactions that collided do not collide again in step.
            await asyncio.sleep(random.uniform(0.005, 0.02) * 2**tries)
    raise AssertionError("unreachable")


async def ping(pool: Pool, timeout_s: float) -> None:
    """Return once the database answers a query; raise if it does not within `timeout_s`."""
    async with pool.connection(timeout=timeout_s) as conn:
        await conn.execute("SELECT 1")
