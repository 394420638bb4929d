"""Authentication: API keys (stored hashed) map to a principal; one default principal otherwise."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field

from fastapi import Depends, HTTPException, Request, status

from server.db import Pool
from server.ids import new_id
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
    pool: Pool, tenant_id: str, user_id: str, roles: list[str], label: str | None = None
) -> str:
    """Create an API key and return it; only its hash is stored, so show it once."""
    key = "ak_" + secrets.token_urlsafe(32)
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO api_keys (id, tenant_id, user_id, roles, key_hash, label)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            (new_id("key"), tenant_id, user_id, roles, hash_key(key), label),
        )
    return key


def _presented_key(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return request.headers.get("x-api-key")


async def get_principal(request: Request) -> Principal:
    """Resolve the caller; 401 when auth is on and the key is missing or unknown."""
    settings: Settings = request.app.state.settings
    if not settings.auth_enabled:
        # Without keys there is one caller, who runs the installation.
        return Principal(
            settings.default_tenant, settings.default_user, frozenset({"admin", OPERATOR})
        )
    key = _presented_key(request)
    if not key:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing API key: send 'Authorization: Bearer <key>' (create one with "
            "'agentrt keys create')",
        )
    pool: Pool = request.app.state.pool
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT tenant_id, user_id, roles FROM api_keys"
            " WHERE key_hash = %s AND revoked_at IS NULL",
            (hash_key(key),),
        )
        row = await cur.fetchone()
    if row is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "unknown or revoked API key")
    return Principal(row["tenant_id"], row["user_id"], frozenset(row["roles"]))


CurrentPrincipal = Depends(get_principal)
