"""The retention job: expire event logs, drop old daily partitions, roll up the ledger.

One process at a time (an advisory lock); the housekeeping loop and `agentrt db prune` call
`apply_retention`. Whole partitions are dropped rather than rows deleted, so the tables do not
bloat; rows are deleted only for tenants whose retention is shorter than the longest one.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta

from psycopg.errors import LockNotAvailable

from server.db.pool import Conn, Pool
from server.lifecycle.erasure import resume_erasures
from server.lifecycle.policy import effective, installation_default, tenant_overrides
from server.observability.metrics import Metrics
from server.runs.records import mark_events_expired
from server.settings import Settings

log = logging.getLogger(__name__)

_RETENTION_LOCK = 7_262_616_020
_BATCH = 1000


@dataclass(frozen=True)
class Daily:
    """A table partitioned by day, and how its retention counts and trims it."""

    kind: str  # the retention setting that decides when its days go
    counted: str  # the field of `Removed` its removed rows add to
    dated_by: str  # its partition key (checked against the schema by a test); trims the default
    weight: str = "1"  # what one row counts for (a span set holds `span_count` spans)


# Daily partitions, created ahead and dropped by the retention.
PARTITIONED = {
    "run_events": Daily("events_days", "events", "ts"),
    "trace_span_sets": Daily("spans_days", "spans", "ended_at", weight="span_count"),
    "trace_payloads": Daily("spans_days", "payloads", "created_at"),
}


@dataclass
class Removed:
    """What one pass removed (and created), for the log and the metrics."""

    expired_runs: int = 0
    events: int = 0
    spans: int = 0
    payloads: int = 0
    ledger: int = 0
    audit: int = 0
    partitions_dropped: list[str] = field(default_factory=list)
    partitions_deferred: list[str] = field(default_factory=list)
    partitions_created: int = 0
    erasures_resumed: int = 0


def partition_day(table: str, name: str) -> date | None:
    """The day of a daily partition from its name (`run_events_20260101`); None otherwise."""
    suffix = name.removeprefix(f"{table}_")
    if len(suffix) != 8 or not suffix.isdigit():
        return None
    return date(int(suffix[:4]), int(suffix[4:6]), int(suffix[6:]))


async def ensure_partitions(conn: Conn, today: date, ahead_days: int, lock_timeout_s: float) -> int:
    """Create the daily partitions from `today` to `ahead_days` later; return how many.

    Creating a partition takes an ACCESS EXCLUSIVE lock on its table, which appends queue
    behind while it waits: a table whose lock is not granted within `lock_timeout_s` is left
    for the next pass (the days are created well ahead).
    """
    made = 0
    for table in PARTITIONED:
        try:
            async with conn.transaction():
                await _set_lock_timeout(conn, lock_timeout_s)
                cur = await conn.execute(
                    "SELECT agentrt_ensure_day_partitions(%s, %s, %s) AS made",
                    (table, today, today + timedelta(days=ahead_days)),
                )
                row = await cur.fetchone()
        except LockNotAvailable:
            log.warning("retention: %s is in use; its new days are left for the next pass", table)
            continue
        made += int(row["made"]) if row else 0
    return made


async def _set_lock_timeout(conn: Conn, seconds: float) -> None:
    """Bound the lock waits of the rest of the caller's transaction."""
    await conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{int(seconds * 1000)}ms",))


async def _partitions(conn: Conn, table: str) -> list[tuple[str, date]]:
    cur = await conn.execute(
        "SELECT c.relname AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = %s::regclass ORDER BY c.relname",
        (table,),
    )
    found = [(r["name"], partition_day(table, r["name"])) for r in await cur.fetchall()]
    return [(name, day) for name, day in found if day is not None]


async def _expire_logs(
    conn: Conn, settings: Settings, now: datetime, longest: int, removed: Removed
) -> None:
    """Mark the logs of runs ended longer ago than their tenant's retention as expired.

    Their rows go with their partitions; a tenant whose retention is shorter than the longest
    has them deleted now, as those partitions stay for other tenants.
    """
    while True:
        async with conn.transaction():
            cur = await conn.execute(
                "SELECT r.id, COALESCE(t.events_days, %(default)s) AS days FROM runs r"
                " LEFT JOIN tenant_retention t ON t.tenant_id = r.tenant_id"
                " WHERE r.events_expired_at IS NULL AND r.finished_at IS NOT NULL"
                " AND r.finished_at < %(now)s::timestamptz"
                "     - make_interval(days => COALESCE(t.events_days, %(default)s))"
                " LIMIT %(batch)s FOR UPDATE OF r SKIP LOCKED",
                {"default": settings.event_retention_days, "now": now, "batch": _BATCH},
            )
            rows = await cur.fetchall()
            if not rows:
                return
            await mark_events_expired(conn, [r["id"] for r in rows])
            early = [r["id"] for r in rows if r["days"] < longest]
            if early:
                gone = await conn.execute("DELETE FROM run_events WHERE run_id = ANY(%s)", (early,))
                removed.events += gone.rowcount
            removed.expired_runs += len(rows)


async def _drop_partition(
    conn: Conn, table: str, name: str, day: date, lock_timeout_s: float, removed: Removed
) -> None:
    """Drop one old partition; events of runs whose logs must stay move to the default first.

    Detaching takes an ACCESS EXCLUSIVE lock on the parent table, and every append or read
    queues behind the request while it waits: a transaction holding the table (a long export)
    would stall them all. The wait is bounded by `lock_timeout_s`; on timeout nothing is
    changed and the day is left for the next pass.
    """
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    try:
        async with conn.transaction():
            kept, rows = await _detach_and_drop(conn, table, name, start, lock_timeout_s)
    except LockNotAvailable:
        log.warning("retention: %s is in use; dropping it is left for the next pass", name)
        removed.partitions_deferred.append(name)
        return
    _count(removed, table, rows - kept)
    removed.partitions_dropped.append(name)


async def _detach_and_drop(
    conn: Conn, table: str, name: str, start: datetime, lock_timeout_s: float
) -> tuple[int, int]:
    """In the caller's transaction: detach and drop `name`; return (rows kept, rows before)."""
    await _set_lock_timeout(conn, lock_timeout_s)
    # A set holds `span_count` spans: counted without reading its spans.
    weight = PARTITIONED[table].weight
    count = await conn.execute(f'SELECT COALESCE(sum({weight}), 0) AS n FROM "{name}"')
    row = await count.fetchone()
    rows = int(row["n"]) if row else 0
    kept = 0
    await conn.execute(f'ALTER TABLE {table} DETACH PARTITION "{name}"')
    if table == "run_events":
        # Runs still in progress, or ended within their retention, that lived that day:
        # their events move to the default partition (the day has no partition now).
        cur = await conn.execute(
            "SELECT id FROM runs WHERE events_expired_at IS NULL"
            " AND created_at - interval '1 day' < %(end)s"
            " AND updated_at + interval '1 day' >= %(start)s",
            {"start": start, "end": start + timedelta(days=1)},
        )
        keep = [r["id"] for r in await cur.fetchall()]
        if keep:
            moved = await conn.execute(
                f'INSERT INTO run_events SELECT * FROM "{name}" WHERE run_id = ANY(%s)',
                (keep,),
            )
            kept = moved.rowcount
    await conn.execute(f'DROP TABLE "{name}"')
    return kept, rows


async def _drop_partitions(
    conn: Conn, table: str, horizon: datetime, lock_timeout_s: float, removed: Removed
) -> None:
    """Drop the daily partitions of `table` whose whole day is older than `horizon`."""
    for name, day in await _partitions(conn, table):
        end = datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(days=1)
        if end <= horizon:
            await _drop_partition(conn, table, name, day, lock_timeout_s, removed)
    # Rows the default partition caught for days long gone (a job that did not run).
    if table == "run_events":
        gone = await conn.execute(
            "DELETE FROM run_events_default e WHERE e.ts < %s AND EXISTS (SELECT 1 FROM runs r"
            " WHERE r.id = e.run_id AND r.events_expired_at IS NOT NULL)",
            (horizon,),
        )
        removed.events += gone.rowcount
        return
    daily = PARTITIONED[table]
    cur = await conn.execute(
        f"WITH gone AS (DELETE FROM {table}_default WHERE {daily.dated_by} < %s"
        f" RETURNING {daily.weight} AS weight) SELECT COALESCE(sum(weight), 0) AS n FROM gone",
        (horizon,),
    )
    row = await cur.fetchone()
    _count(removed, table, int(row["n"]) if row else 0)


def _count(removed: Removed, table: str, rows: int) -> None:
    """Add `rows` removed from `table` to what the pass removed."""
    field_name = PARTITIONED[table].counted
    setattr(removed, field_name, getattr(removed, field_name) + rows)


async def _trim_short_spans(
    conn: Conn, overrides: dict[str, int], now: datetime, removed: Removed
) -> None:
    """Delete spans (and payloads) of tenants whose span retention is below the longest."""
    for tenant, days in overrides.items():
        cur = await conn.execute(
            "WITH gone AS (DELETE FROM trace_span_sets WHERE tenant_id = %(t)s"
            " AND ended_at < %(now)s::timestamptz - make_interval(days => %(d)s)"
            " RETURNING trace_id, span_count, spans, spans_text), payloads AS ("
            " DELETE FROM trace_payloads p USING gone CROSS JOIN LATERAL"
            " jsonb_array_elements(COALESCE(gone.spans, gone.spans_text::jsonb)) AS s"
            " WHERE p.trace_id = gone.trace_id AND p.span_id = s ->> 'span_id'"
            " RETURNING 1)"
            " SELECT (SELECT COALESCE(sum(span_count), 0) FROM gone) AS spans,"
            " (SELECT count(*) FROM payloads) AS payloads",
            {"t": tenant, "now": now, "d": days},
        )
        row = await cur.fetchone()
        if row:
            removed.spans += int(row["spans"])
            removed.payloads += int(row["payloads"])


async def _roll_up_ledger(conn: Conn, settings: Settings, now: datetime, removed: Removed) -> None:
    """Sum model-call rows past the ledger retention into `model_usage_daily`, then drop them.

    A row stays while its run's log does (until the retention marks it expired): a stored
    `usage` event may hold only a stub of the call, which reads of the log fill from the row.
    """
    while True:
        cur = await conn.execute(
            """
            WITH gone AS (
                DELETE FROM model_calls WHERE id IN (
                    SELECT m.id FROM model_calls m
                    LEFT JOIN tenant_retention t ON t.tenant_id = m.tenant_id
                    WHERE m.created_at < %(now)s::timestamptz
                        - make_interval(days => COALESCE(t.ledger_days, %(default)s))
                    -- Kept while its run's log is: a `usage` event reads its call back from
                    -- the row (docs/decisions/2042).
                    AND EXISTS (SELECT FROM runs r
                        WHERE r.id = m.run_id AND r.events_expired_at IS NOT NULL)
                    LIMIT %(batch)s)
                RETURNING *
            ), summed AS (
                INSERT INTO model_usage_daily AS d
                SELECT tenant_id, user_id, (created_at AT TIME ZONE 'UTC')::date, provider,
                    model, count(*), count(*) FILTER (WHERE status = 'failed'),
                    COALESCE(sum(input_tokens), 0), COALESCE(sum(output_tokens), 0),
                    COALESCE(sum(cached_input_tokens), 0), COALESCE(sum(reasoning_tokens), 0),
                    COALESCE(sum(total_tokens), 0), COALESCE(sum(cost), 0),
                    count(*) FILTER (WHERE cost IS NULL)
                FROM gone GROUP BY 1, 2, 3, 4, 5
                ON CONFLICT (tenant_id, user_id, day, provider, model) DO UPDATE SET
                    calls = d.calls + EXCLUDED.calls,
                    failed_calls = d.failed_calls + EXCLUDED.failed_calls,
                    input_tokens = d.input_tokens + EXCLUDED.input_tokens,
                    output_tokens = d.output_tokens + EXCLUDED.output_tokens,
                    cached_input_tokens = d.cached_input_tokens + EXCLUDED.cached_input_tokens,
                    reasoning_tokens = d.reasoning_tokens + EXCLUDED.reasoning_tokens,
                    total_tokens = d.total_tokens + EXCLUDED.total_tokens,
                    cost = d.cost + EXCLUDED.cost,
                    unpriced_calls = d.unpriced_calls + EXCLUDED.unpriced_calls
            )
            SELECT count(*) AS n FROM gone
            """,
            {"now": now, "default": settings.ledger_retention_days, "batch": _BATCH * 5},
        )
        row = await cur.fetchone()
        n = int(row["n"]) if row else 0
        removed.ledger += n
        if n == 0:
            return


async def apply_retention(
    pool: Pool, settings: Settings, *, metrics: Metrics | None = None, now: datetime | None = None
) -> Removed | None:
    """Apply every retention once; None if another process holds the job.

    Args:
        pool: The pool.
        settings: The installation's defaults (tenants override them in `tenant_retention`).
        metrics: Counts what was removed (`agentrt_retention_removed_total`).
        now: The job's clock (tests move it forward); the database's time otherwise.
    """
    removed = Removed()
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT pg_try_advisory_lock(%s) AS ok, now() AS now", (_RETENTION_LOCK,)
        )
        row = await cur.fetchone()
        if not row or not row["ok"]:
            return None
        now = now or row["now"]
        try:
            default = installation_default(settings)
            overrides = await tenant_overrides(conn)
            every = [default] + [effective(default, o) for o in overrides.values()]
            longest_events = max(r.events_days for r in every)
            longest_spans = max(r.spans_days for r in every)
            removed.partitions_created = await ensure_partitions(
                conn,
                now.astimezone(UTC).date(),
                settings.partitions_ahead_days,
                settings.retention_lock_timeout_s,
            )
            await _expire_logs(conn, settings, now, longest_events, removed)
            horizons = {
                "events_days": now - timedelta(days=longest_events),
                "spans_days": now - timedelta(days=longest_spans),
            }
            for table, daily in PARTITIONED.items():
                await _drop_partitions(
                    conn, table, horizons[daily.kind], settings.retention_lock_timeout_s, removed
                )
            shorter = {
                tenant: days
                for tenant, o in overrides.items()
                if (days := effective(default, o).spans_days) < longest_spans
            }
            await _trim_short_spans(conn, shorter, now, removed)
            await _roll_up_ledger(conn, settings, now, removed)
            gone = await conn.execute(
                "DELETE FROM audit_log a WHERE a.at < %(now)s::timestamptz - make_interval(days =>"
                " COALESCE((SELECT t.audit_days FROM tenant_retention t"
                " WHERE t.tenant_id = a.tenant_id), %(default)s))",
                {"now": now, "default": settings.audit_retention_days},
            )
            removed.audit = gone.rowcount
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (_RETENTION_LOCK,))
    removed.erasures_resumed = await resume_erasures(pool)
    _report(removed, metrics)
    return removed


def _report(removed: Removed, metrics: Metrics | None) -> None:
    counts = {k: v for k, v in asdict(removed).items() if v}
    if counts:
        log.info("retention: %s", counts)
    if metrics is not None:
        for kind in ("events", "spans", "payloads", "ledger", "audit"):
            amount = getattr(removed, kind)
            if amount:
                metrics.retention_removed.labels(kind).inc(amount)
