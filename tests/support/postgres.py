"""A real PostgreSQL for tests: `DATABASE_URL` if set, else the embedded pgserver."""

from __future__ import annotations

import secrets
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo


def server_url(tmp_root: Path, external: str | None) -> str:
    """Return the admin URL of the Postgres server the tests use."""
    if external:
        return external
    import pgserver

    server = pgserver.get_server(tmp_root / "pg", cleanup_mode="stop")
    return str(server.get_uri())


def stop_server(tmp_root: Path) -> None:
    """Stop the embedded server started by `server_url`, if any."""
    if (tmp_root / "pg").exists():
        import pgserver

        pgserver.get_server(tmp_root / "pg", cleanup_mode="stop").cleanup()


def create_database(admin_url: str, prefix: str = "t") -> str:
    """Create a fresh database with a unique name and return its URL."""
    name = f"{prefix}_{secrets.token_hex(6)}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    params = conninfo_to_dict(admin_url)
    params["dbname"] = name
    return make_conninfo(**params)  # type: ignore[arg-type]


def drop_database(admin_url: str, url: str) -> None:
    """Drop a database made by `create_database`, disconnecting its sessions."""
    name = conninfo_to_dict(url)["dbname"]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


MIGRATIONS = Path(__file__).resolve().parents[2] / "server" / "db" / "migrations"


def migrate_before(conn: psycopg.Connection, version: int) -> None:
    """Apply the migrations numbered below `version`, as `migrate` records them (autocommit)."""
    conn.execute(
        "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
        " applied_at timestamptz NOT NULL DEFAULT now())"
    )
    for path in sorted(MIGRATIONS.glob("*.sql")):
        number = int(path.name.split("_", 1)[0])
        if number >= version:
            continue
        with conn.transaction():
            conn.execute(path.read_text().encode())
            conn.execute(
                "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                (number, path.name),
            )
