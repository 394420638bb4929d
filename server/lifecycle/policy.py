"""Retention policy: the installation's defaults and each tenant's overrides."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from server.auth import Principal
from server.db.pool import Conn, Pool
from server.lifecycle import audit
from server.settings import Settings

KINDS = ("events_days", "spans_days", "ledger_days", "audit_days")


@dataclass(frozen=True)
class Retention:
    """How many days each kind of data is kept after its run ended (or it was written)."""

    events_days: int
    spans_days: int
    ledger_days: int
    audit_days: int

    def view(self) -> dict[str, int]:
        """The API's view (camelCase)."""
        return {
            "eventsDays": self.events_days,
            "spansDays": self.spans_days,
            "ledgerDays": self.ledger_days,
            "auditDays": self.audit_days,
        }


def installation_default(settings: Settings) -> Retention:
    """The retention of tenants without overrides."""
    return Retention(
        settings.event_retention_days,
        settings.span_retention_days,
        settings.ledger_retention_days,
        settings.audit_retention_days,
    )


async def tenant_overrides(conn: Conn) -> dict[str, dict[str, int | None]]:
    """Every tenant's stored overrides (None: the default)."""
    cur = await conn.execute(f"SELECT tenant_id, {', '.join(KINDS)} FROM tenant_retention")
    return {r["tenant_id"]: {k: r[k] for k in KINDS} for r in await cur.fetchall()}


def effective(default: Retention, overrides: dict[str, int | None] | None) -> Retention:
    """A tenant's retention: its overrides over the default."""
    values = asdict(default)
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return Retention(**values)


async def get_retention(pool: Pool, settings: Settings, tenant_id: str) -> dict[str, Any]:
    """Return a tenant's effective retention, its overrides and the installation's default."""
    async with pool.connection() as conn:
        overrides = (await tenant_overrides(conn)).get(tenant_id, {})
    default = installation_default(settings)
    return {
        "tenantId": tenant_id,
        "effective": effective(default, overrides).view(),
        "overrides": {k: v for k, v in _camel(overrides).items() if v is not None},
        "defaults": default.view(),
    }


def _camel(values: dict[str, int | None]) -> dict[str, int | None]:
    names = dict(zip(KINDS, ("eventsDays", "spansDays", "ledgerDays", "auditDays"), strict=True))
    return {names[k]: v for k, v in values.items()}


async def set_retention(
    pool: Pool, settings: Settings, who: Principal, overrides: dict[str, int | None]
) -> dict[str, Any]:
    """Replace the caller's tenant's overrides (None or absent: the default); audited."""
    values = {k: overrides.get(k) for k in KINDS}
    async with pool.connection() as conn, conn.transaction():
        before = (await tenant_overrides(conn)).get(who.tenant_id, {})
        await conn.execute(
            "INSERT INTO tenant_retention (tenant_id, events_days, spans_days, ledger_days,"
            " audit_days, updated_by) VALUES (%(t)s, %(events_days)s, %(spans_days)s,"
            " %(ledger_days)s, %(audit_days)s, %(by)s) ON CONFLICT (tenant_id) DO UPDATE SET"
            " events_days = EXCLUDED.events_days, spans_days = EXCLUDED.spans_days,"
            " ledger_days = EXCLUDED.ledger_days, audit_days = EXCLUDED.audit_days,"
            " updated_by = EXCLUDED.updated_by, updated_at = now()",
            {"t": who.tenant_id, "by": who.user_id, **values},
        )
        await audit.record(
            conn,
            tenant_id=who.tenant_id,
            actor=who.user_id,
            action="retention.changed",
            target=f"retention:{who.tenant_id}",
            diff=audit.small_diff(_camel(before), _camel(values)),
        )
    return await get_retention(pool, settings, who.tenant_id)
