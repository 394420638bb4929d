"""The audit log: one append-only row per security-relevant action, never a secret.

Writers call `record` on the connection (and inside the transaction) of the action itself, so
an action and its audit row are stored together or not at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from server.db.pool import Conn, Pool

# Keys whose values never enter a diff, at any depth (MCP headers and env, tokens, keys).
_SECRET_WORDS = ("secret", "token", "password", "key", "headers", "env", "authorization")
_MAX_VALUE_CHARS = 200

ACTIONS = (
    "key.created",
    "key.revoked",
    "approval.decided",
    "tool_config.changed",
    "agent.created",
    "agent.updated",
    "agent.deleted",
    "run.cancel_requested",
    "run.pause_requested",
    "run.resumed",
    "retention.changed",
    "data.erased",
    "skill.uploaded",
    "skill.enabled",
    "skill.disabled",
)
"""Every action the audit log records (docs/operations.md lists them with their targets)."""


def _is_secret(key: str) -> bool:
    lowered = key.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def _small(value: Any) -> Any:
    """A value as the diff shows it: scalars as they are (cut short), containers by size."""
    if isinstance(value, str):
        return value if len(value) <= _MAX_VALUE_CHARS else value[:_MAX_VALUE_CHARS] + "…"
    if isinstance(value, Mapping):
        return f"<{len(value)} keys>"
    if isinstance(value, list | tuple):
        return f"<{len(value)} items>"
    return value


def small_diff(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> dict[str, Any]:
    """Return what changed between two configurations, by dotted key, secrets hidden.

    Example: `{"tools.allow": {"from": "<2 items>", "to": "<3 items>"}}`. A secret's change
    is shown as `"[redacted]"` on both sides, so the row says that it changed, not to what.
    """
    changes: dict[str, Any] = {}

    def walk(prefix: str, old: Any, new: Any) -> None:
        # A section added or removed is walked as if empty on the other side.
        if old is None and isinstance(new, Mapping):
            old = {}
        if new is None and isinstance(old, Mapping):
            new = {}
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            for key in sorted(set(old) | set(new), key=str):
                path = f"{prefix}.{key}" if prefix else str(key)
                if _is_secret(str(key)):
                    if old.get(key) != new.get(key):
                        changes[path] = {"from": "[redacted]", "to": "[redacted]"}
                    continue
                walk(path, old.get(key), new.get(key))
        elif old != new:
            changes[prefix or "value"] = {"from": _small(old), "to": _small(new)}

    walk("", dict(before or {}), dict(after or {}))
    return changes


async def record(
    conn: Conn,
    *,
    tenant_id: str,
    actor: str,
    action: str,
    target: str,
    diff: Mapping[str, Any] | None = None,
) -> None:
    """Append one audit row on `conn` (in the caller's transaction, if any)."""
    assert action in ACTIONS, action
    await conn.execute(
        "INSERT INTO audit_log (tenant_id, actor, action, target, diff)"
        " VALUES (%s, %s, %s, %s, %s)",
        (tenant_id, actor, action, target, Jsonb(dict(diff or {}))),
    )


@dataclass(frozen=True)
class AuditFilter:
    """What `GET /api/audit` narrows by; None means any."""

    tenant_id: str | None = None
    actor: str | None = None
    action: str | None = None
    target: str | None = None
    since: datetime | None = None
    until: datetime | None = None


async def list_audit(
    pool: Pool, where: AuditFilter, *, before: int | None, limit: int
) -> tuple[list[dict[str, Any]], int | None]:
    """Return audit rows newest first, and the cursor of the next page (None at the end)."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT id, at, tenant_id, actor, action, target, diff FROM audit_log"
            " WHERE (%(tenant)s::text IS NULL OR tenant_id = %(tenant)s)"
            " AND (%(actor)s::text IS NULL OR actor = %(actor)s)"
            " AND (%(action)s::text IS NULL OR action = %(action)s"
            "      OR action LIKE %(action)s || '.%%')"
            " AND (%(target)s::text IS NULL OR target = %(target)s)"
            " AND (%(since)s::timestamptz IS NULL OR at >= %(since)s)"
            " AND (%(until)s::timestamptz IS NULL OR at < %(until)s)"
            " AND (%(before)s::bigint IS NULL OR id < %(before)s)"
            " ORDER BY id DESC LIMIT %(limit)s",
            {
                "tenant": where.tenant_id,
                "actor": where.actor,
                "action": where.action,
                "target": where.target,
                "since": where.since,
                "until": where.until,
                "before": before,
                "limit": limit + 1,
            },
        )
        rows = [dict(r) for r in await cur.fetchall()]
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (rows[-1]["id"] if more and rows else None)


def audit_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """The API's view of an audit row."""
    return {
        "id": str(row["id"]),
        "at": row["at"].isoformat(),
        "tenantId": row["tenant_id"],
        "actor": row["actor"],
        "action": row["action"],
        "target": row["target"],
        "diff": row["diff"],
    }
