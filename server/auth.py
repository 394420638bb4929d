"""Authentication: API keys (stored hashed) map to a principal; one default principal otherwise."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from typing import Any

from server.db.pool import Pool
from server.errors import ForbiddenError, UnauthorizedError
from server.ids import new_id
from server.lifecycle import audit
from server.settings import Settings

OPERATOR = "operator"
"""The role that sees the whole installation (all tenants' metrics, the queue, worker hosts).

Every other role, `admin` included, acts within the principal's own tenant.
"""


@dataclass(frozen=True)
class Principal:
    """Who is calling: every query is scoped by `tenant_id`, except the operator's views."""

    tenant_id: str
    user_id: str
    roles: frozenset[str] = field(default_factory=frozenset)

    def has_role(self, role: str) -> bool:
        """Say whether the principal holds `role` (a tenant admin holds every tenant role).

        `operator` is not a tenant role: only a key created with it holds it.
        """
        return role in self.roles or ("admin" in self.roles and role != OPERATOR)

    @property
    def is_operator(self) -> bool:
        """Say whether the principal may see the whole installation."""
        return OPERATOR in self.roles


def hash_key(key: str) -> str:
    """Hash an API key for storage; keys are random, so a plain SHA-256 is enough."""
    return hashlib.sha256(key.encode()).hexdigest()


async def create_api_key(
    pool: Pool,
    tenant_id: str,
    user_id: str,
    roles: list[str],
    label: str | None = None,
    *,
    actor: str = "cli",
) -> str:
    """Create an API key and return it; only its hash is stored, so show it once."""
    key = "ak_" + secrets.token_urlsafe(32)
    key_id = new_id("key")
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO api_keys (id, tenant_id, user_id, roles, key_hash, label)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            (key_id, tenant_id, user_id, roles, hash_key(key), label),
        )
        await audit.record(
            conn,
            tenant_id=tenant_id,
            actor=actor,
            action="key.created",
            target=key_id,
            diff={"user": user_id, "roles": sorted(roles), "label": label},
        )
    return key


def presented_key(authorization: str | None, x_api_key: str | None) -> str | None:
    """Return the API key of a request: a bearer token, else the `X-API-Key` header."""
    header = authorization or ""
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return x_api_key


async def principal_of(settings: Settings, pool: Pool, key: str | None) -> Principal:
    """Resolve the caller of key `key`.

    Raises:
        UnauthorizedError: auth is on and the key is missing, unknown or revoked.
    """
    if not settings.auth_enabled:
        # Without keys there is one caller, who runs the installation.
        return Principal(
            settings.default_tenant, settings.default_user, frozenset({"admin", OPERATOR})
        )
    if not key:
        raise UnauthorizedError(
            "missing API key: send 'Authorization: Bearer <key>' (create one with "
            "'agentrt keys create')"
        )
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT tenant_id, user_id, roles FROM api_keys"
            " WHERE key_hash = %s AND revoked_at IS NULL",
            (hash_key(key),),
        )
        row = await cur.fetchone()
    if row is None:
        raise UnauthorizedError("unknown or revoked API key")
    return Principal(row["tenant_id"], row["user_id"], frozenset(row["roles"]))


def require_admin(who: Principal) -> None:
    """Refuse callers who are neither an operator nor their tenant's admin.

    Raises:
        ForbiddenError: the caller holds neither role.
    """
    if not (who.is_operator or who.has_role("admin")):
        raise ForbiddenError(
            "this endpoint needs the operator role (whole installation) or the admin role "
            "(your tenant)"
        )


async def list_api_keys(pool: Pool, tenant_id: str | None = None) -> list[dict[str, Any]]:
    """Return the API keys (never their secrets), newest first, optionally of one tenant."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT id, tenant_id, user_id, roles, label, created_at, revoked_at FROM api_keys"
            " WHERE %(tenant)s::text IS NULL OR tenant_id = %(tenant)s"
            " ORDER BY created_at DESC, id",
            {"tenant": tenant_id},
        )
        return [dict(row) for row in await cur.fetchall()]


async def revoke_api_key(pool: Pool, key_id: str, *, actor: str = "cli") -> bool:
    """Revoke a key by its id; say whether a live key was revoked."""
    async with pool.connection() as conn, conn.transaction():
        cur = await conn.execute(
            "UPDATE api_keys SET revoked_at = now() WHERE id = %s AND revoked_at IS NULL"
            " RETURNING tenant_id, user_id",
            (key_id,),
        )
        row = await cur.fetchone()
        if row is None:
            return False
        await audit.record(
            conn,
            tenant_id=row["tenant_id"],
            actor=actor,
            action="key.revoked",
            target=key_id,
            diff={"user": row["user_id"]},
        )
        return True
