"""Start-up checks that fail fast with one line a person can act on.

The CLI runs them before it starts workers or binds the API, so that a bad `DATABASE_URL`, a busy
port or an unusable default model is reported in a few seconds instead of a long traceback.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
from psycopg.conninfo import conninfo_to_dict

from server.errors import StartupError

log = logging.getLogger("agentrt")

EXAMPLE_URL = "postgresql://user:password@host:5432/dbname"


def redact_url(url: str) -> str:
    """Hide the password in a database URL for logs."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else url


def check_database_url(url: str) -> None:
    """Raise StartupError unless `url` parses as a PostgreSQL connection string."""
    try:
        conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        reason = str(exc).strip().splitlines()[0]
        raise StartupError(
            f"DATABASE_URL={url!r} is not a PostgreSQL URL ({reason}); "
            f"expected e.g. {EXAMPLE_URL}, or unset it to use the embedded database"
        ) from None


async def check_database(url: str, timeout_s: float = 5.0) -> None:
    """Raise StartupError unless one connection to `url` opens within about `timeout_s`."""
    check_database_url(url)
    try:
        async with asyncio.timeout(timeout_s + 1):
            conn = await psycopg.AsyncConnection.connect(
                url, connect_timeout=max(1, round(timeout_s))
            )
        await conn.close()
    except (psycopg.OperationalError, TimeoutError) as exc:
        reason = (str(exc).strip().splitlines() or ["timed out"])[-1]
        raise StartupError(
            f"cannot connect to the database at {redact_url(url)}: {reason}"
            " (check DATABASE_URL and that the server is up)"
        ) from None


def bind_port(host: str, port: int) -> socket.socket:
    """Bind the API's listening socket now, or raise StartupError if the port is taken.

    The bound socket is handed to uvicorn, so no other process can take the port between this
    check and the server starting.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise StartupError(
            f"cannot listen on {host}:{port}: {exc.strerror}; stop the process using it "
            "(is another 'agentrt serve' running?) or choose another port with --port or "
            "AGENTRT_PORT"
        ) from None
    sock.set_inheritable(True)
    return sock


@asynccontextmanager
async def waiting(what: str, after_s: float = 1.0) -> AsyncIterator[None]:
    """Log what start-up is waiting for when a step takes longer than `after_s`."""
    handle = asyncio.get_running_loop().call_later(
        after_s, log.info, "start-up: waiting for %s", what
    )
    try:
        yield
    finally:
        handle.cancel()
