"""The analysts' read-only database role: the memory views and nothing else."""

from __future__ import annotations

import secrets

from psycopg import sql

from server.db.pool import Pool

ANALYST_VIEWS = ("analytics_memories", "analytics_memory_jobs", "analytics_embedding_calls")


async def create_analyst_role(pool: Pool, name: str, password: str | None) -> str:
    """Create (or reset) a login role that may only read the analysts' views; return its password.

    The views run with their owner's rights, so the role needs no right on the tables below.
    """
    password = password or secrets.token_urlsafe(24)
    role = sql.Identifier(name)
    async with pool.connection() as conn, conn.transaction():
        cur = await conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,))
        verb = sql.SQL("ALTER") if await cur.fetchone() else sql.SQL("CREATE")
        await conn.execute(
            sql.SQL(
                "{} ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT PASSWORD {}"
            ).format(verb, role, sql.Literal(password))
        )
        await conn.execute(
            sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
                sql.Identifier(conn.info.dbname), role
            )
        )
        await conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(role))
        for view in ANALYST_VIEWS:
            await conn.execute(
                sql.SQL("GRANT SELECT ON {} TO {}").format(sql.Identifier(view), role)
            )
        await conn.execute(
            sql.SQL("ALTER ROLE {} SET default_transaction_read_only = on").format(role)
        )
    return password
