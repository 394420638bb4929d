"""Idempotency keys for requests that create something: a retry returns the first answer."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from server.db.pool import Conn
from server.errors import IdempotencyKeyReusedError, InvalidIdempotencyKeyError

HEADER = "Idempotency-Key"
MAX_KEY_CHARS = 255


@dataclass(frozen=True)
class IdempotencyKey:
    """A client's key and the fingerprint of the request body it came with."""

    key: str
    fingerprint: str


def idempotency_key(header: str | None, body: dict[str, Any]) -> IdempotencyKey | None:
    """Return the request's key with the fingerprint of `body`, or None without the header.

    Raises:
        InvalidIdempotencyKeyError: the key is empty, too long, or not printable ASCII.
    """
    if header is None:
        return None
    key = header.strip()
    if not key or len(key) > MAX_KEY_CHARS or not key.isascii() or not key.isprintable():
        raise InvalidIdempotencyKeyError(
            f"the {HEADER} header must be 1 to {MAX_KEY_CHARS} printable ASCII characters "
            "(a UUID is a good choice)"
        )
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return IdempotencyKey(key, hashlib.sha256(canonical.encode()).hexdigest())


async def find_response(
    conn: Conn, conversation_id: str, key: IdempotencyKey
) -> dict[str, Any] | None:
    """Return the response first given for `key`, or None if the key is new.

    Call it with the conversation locked, so that two requests with one key are ordered.

    Raises:
        IdempotencyKeyReusedError: the key came with a different body before.
    """
    cur = await conn.execute(
        "SELECT fingerprint, run_id, response FROM idempotency_keys"
        " WHERE conversation_id = %s AND key = %s",
        (conversation_id, key.key),
    )
    row = await cur.fetchone()
    if row is None:
        return None
    if row["fingerprint"] != key.fingerprint:
        raise IdempotencyKeyReusedError(key.key, row["run_id"])
    response: dict[str, Any] = row["response"]
    return response


async def remember_response(
    conn: Conn,
    tenant_id: str,
    conversation_id: str,
    key: IdempotencyKey,
    run_id: str,
    response: dict[str, Any],
) -> None:
    """Store the response to `key`, in the transaction that created what it describes."""
    await conn.execute(
        "INSERT INTO idempotency_keys"
        " (conversation_id, key, tenant_id, fingerprint, run_id, response)"
        " VALUES (%s, %s, %s, %s, %s, %s)",
        (conversation_id, key.key, tenant_id, key.fingerprint, run_id, Jsonb(response)),
    )
