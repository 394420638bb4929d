"""The tool ledger: one row per (run, tool call id), so that a side effect happens once.

A call is `claim`ed before it executes and `record`ed when it ends. A replay that reaches a
recorded call gets the recorded outcome instead of executing again. A row left `started` by an
earlier attempt (whose worker died) is *in doubt*: the pipeline's policy decides whether it may
be run again (see docs/tools.md, "Exactly-once side effects").

On a run's first attempt, a call that is safe to run again is not claimed in the database
before it executes: its row is written once, with its outcome, in the transaction that stores
the call's `tool.completed` or `tool.failed` event (`HeldOutcomes`, docs/decisions/2026). A crash
before that commit loses nothing anyone saw, and the next attempt runs the call again, as it
would an in-doubt one.

Every write is fenced by the run's lease generation: only the attempt that holds the row may
record its outcome, so a stale worker cannot overwrite a newer attempt's result.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal

from psycopg import AsyncCursor
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

LedgerStatus = Literal["started", "completed", "failed"]


class Claim(StrEnum):
    """What `claim` found."""

    NEW = "new"  # no row: this attempt owns the call and executes it
    RECORDED = "recorded"  # an outcome is stored: use it, do not execute
    IN_DOUBT = "in_doubt"  # started by an earlier attempt, no outcome
    BUSY = "busy"  # started by this very attempt (a duplicate call id in one turn)


@dataclass(frozen=True)
class LedgerEntry:
    """One ledger row."""

    run_id: str
    tool_call_id: str
    tool_name: str
    args: dict[str, Any]
    idempotency_key: str
    status: LedgerStatus
    generation: int
    attempts: int = 0
    output: str | None = None
    error: str | None = None
    error_type: str | None = None
    duration_ms: float | None = None


def idempotency_key(run_id: str, tool_call_id: str) -> str:
    """Return the stable idempotency key of a tool call (same on every replay and re-run)."""
    digest = hashlib.sha256(f"{run_id}\x00{tool_call_id}".encode()).hexdigest()
    return f"agentrt-{digest[:40]}"


@dataclass(frozen=True)
class Outcome:
    """How a claimed call ended, as the ledger stores it (`output` or `error`, by status)."""

    status: Literal["completed", "failed"]
    attempts: int
    duration_ms: float
    output: str | None = None
    error: str | None = None
    error_type: str | None = None


class ToolLedger(ABC):
    """Where tool outcomes are kept. `PostgresToolLedger` in production."""

    @abstractmethod
    async def claim(
        self, entry: LedgerEntry, *, rerunnable: bool = False
    ) -> tuple[Claim, LedgerEntry]:
        """Insert `entry` as started unless a row exists; return what was found.

        `rerunnable`: the call's tool is safe to run again (`ToolSpec.safe_to_rerun`); a
        ledger may then keep the row until the outcome is stored with its event.
        """

    @abstractmethod
    async def take_over(self, run_id: str, tool_call_id: str, generation: int) -> bool:
        """Make an in-doubt row this attempt's (to run it again); False if someone else did."""

    @abstractmethod
    async def store(
        self, run_id: str, tool_call_id: str, generation: int, outcome: Outcome
    ) -> bool:
        """Store the outcome of a call; False when the row is no longer this attempt's."""

    async def record(
        self,
        run_id: str,
        tool_call_id: str,
        generation: int,
        *,
        status: Literal["completed", "failed"],
        attempts: int,
        duration_ms: float,
        output: str | None = None,
        error: str | None = None,
        error_type: str | None = None,
    ) -> bool:
        """Store an outcome given field by field (see `store`)."""
        outcome = Outcome(status, attempts, duration_ms, output, error, error_type)
        return await self.store(run_id, tool_call_id, generation, outcome)


class InMemoryToolLedger(ToolLedger):
    """A ledger in a dict: for unit tests and for running the graph without a database."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], LedgerEntry] = {}

    async def claim(
        self, entry: LedgerEntry, *, rerunnable: bool = False
    ) -> tuple[Claim, LedgerEntry]:
        """Insert `entry` as started unless a row exists; return what was found."""
        key = (entry.run_id, entry.tool_call_id)
        found = self.rows.get(key)
        if found is None:
            self.rows[key] = entry
            return Claim.NEW, entry
        return _classify(found, entry.generation), found

    async def take_over(self, run_id: str, tool_call_id: str, generation: int) -> bool:
        """Make an in-doubt row this attempt's (to run it again); False if someone else did."""
        found = self.rows.get((run_id, tool_call_id))
        if found is None or found.status != "started" or found.generation >= generation:
            return False
        self.rows[(run_id, tool_call_id)] = replace(
            found, generation=generation, attempts=found.attempts + 1
        )
        return True

    async def store(
        self, run_id: str, tool_call_id: str, generation: int, outcome: Outcome
    ) -> bool:
        """Store the outcome of a call; False when the row is no longer this attempt's."""
        found = self.rows.get((run_id, tool_call_id))
        if found is None or found.status != "started" or found.generation != generation:
            return False
        self.rows[(run_id, tool_call_id)] = _with_outcome(found, outcome)
        return True


def _with_outcome(found: LedgerEntry, outcome: Outcome) -> LedgerEntry:
    """Return a started row with `outcome` recorded in it."""
    return replace(
        found,
        status=outcome.status,
        attempts=found.attempts + outcome.attempts,
        duration_ms=outcome.duration_ms,
        output=outcome.output,
        error=outcome.error,
        error_type=outcome.error_type,
    )


def _classify(found: LedgerEntry, generation: int) -> Claim:
    if found.status != "started":
        return Claim.RECORDED
    return Claim.BUSY if found.generation >= generation else Claim.IN_DOUBT


_CLAIM = """
INSERT INTO tool_ledger (run_id, tool_call_id, tenant_id, tool_name, args, idempotency_key,
                         status, generation)
VALUES (%(run_id)s, %(tool_call_id)s, %(tenant_id)s, %(tool_name)s, %(args)s,
        %(idempotency_key)s, 'started', %(generation)s)
ON CONFLICT (run_id, tool_call_id) DO NOTHING
"""
_SELECT = "SELECT * FROM tool_ledger WHERE run_id = %s AND tool_call_id = %s"
_TAKE_OVER = """
UPDATE tool_ledger SET generation = %(generation)s, attempts = attempts + 1, started_at = now()
WHERE run_id = %(run_id)s AND tool_call_id = %(tool_call_id)s AND status = 'started'
  AND generation < %(generation)s
"""
_RECORD = """
UPDATE tool_ledger SET status = %(status)s, attempts = attempts + %(attempts)s,
    output = %(output)s, error = %(error)s, error_type = %(error_type)s,
    duration_ms = %(duration_ms)s, finished_at = now()
WHERE run_id = %(run_id)s AND tool_call_id = %(tool_call_id)s AND status = 'started'
  AND generation = %(generation)s
"""


# The most calls, and characters of outcomes, one attempt holds in memory (`HeldOutcomes`).
HELD_MAX_CALLS = 1_000
HELD_MAX_CHARS = 4_000_000
# A held call's row, written with its outcome's event; a repeat of that write (a batch written
# again after a commit in doubt, a replay's event) changes nothing. A test of the key, not
# `ON CONFLICT`: a speculative insertion writes a second WAL record per row. Nobody else can
# write the row meanwhile: the attempt holds the run's lease, and a takeover that claims the
# call moves the lease generation first, which the batch's own append then finds moved.
_INSERT_HELD = """
INSERT INTO tool_ledger (run_id, tool_call_id, tenant_id, tool_name, args, idempotency_key,
                         status, generation, attempts, output, error, error_type, duration_ms,
                         started_at, finished_at)
SELECT %(run_id)s, %(tool_call_id)s, %(tenant_id)s, %(tool_name)s, %(args)s,
        %(idempotency_key)s, %(status)s, %(generation)s, %(attempts)s, %(output)s, %(error)s,
        %(error_type)s, %(duration_ms)s, %(started_at)s, now()
WHERE NOT EXISTS (SELECT FROM tool_ledger
                  WHERE run_id = %(run_id)s AND tool_call_id = %(tool_call_id)s)
"""


class HeldOutcomes:
    """Calls of a run's first attempt whose rows wait for their outcome's event.

    The attempt's `PostgresToolLedger` keeps here the calls of tools that are safe to run
    again, instead of claiming them in the database before they execute; the run's event
    writer calls `write` with every batch that holds `tool.completed` or `tool.failed`
    events, in the batch's transaction. Only for a first attempt: no earlier attempt can
    have left a row that a claim would have found.

    Held calls stay in memory for the attempt (a later call with the same id is answered from
    here), so an attempt holds at most `max_calls` calls and stops holding new ones once their
    outputs add up to `max_chars`: later calls are claimed in the database first, as on any
    other attempt.
    """

    def __init__(
        self, tenant_id: str, max_calls: int = HELD_MAX_CALLS, max_chars: int = HELD_MAX_CHARS
    ) -> None:
        self.tenant_id = tenant_id
        self.entries: dict[str, LedgerEntry] = {}  # by tool call id
        self.started_at: dict[str, datetime] = {}
        self.max_calls, self.max_chars = max_calls, max_chars
        self.chars = 0  # of the outcomes held

    def has_room(self) -> bool:
        """Say whether one more call may be held."""
        return len(self.entries) < self.max_calls and self.chars < self.max_chars

    def hold(self, entry: LedgerEntry) -> None:
        """Keep `entry` (started) for the outcome to come."""
        self.entries[entry.tool_call_id] = entry
        self.started_at[entry.tool_call_id] = datetime.now(UTC)

    def record(self, entry: LedgerEntry, outcome: Outcome) -> None:
        """Keep `outcome` with the held `entry`, to be written with its event."""
        self.entries[entry.tool_call_id] = _with_outcome(entry, outcome)
        self.chars += len(outcome.output or "") + len(outcome.error or "")

    async def write(self, cur: AsyncCursor[Any], tool_call_ids: Iterable[str]) -> None:
        """Insert the rows of those calls that have an outcome, in the caller's transaction."""
        rows = []
        for call_id in tool_call_ids:
            entry = self.entries.get(call_id)
            if entry is None or entry.status == "started":
                continue
            rows.append(
                {
                    "run_id": entry.run_id,
                    "tool_call_id": call_id,
                    "tenant_id": self.tenant_id,
                    "tool_name": entry.tool_name,
                    "args": Jsonb(entry.args),
                    "idempotency_key": entry.idempotency_key,
                    "status": entry.status,
                    "generation": entry.generation,
                    "attempts": entry.attempts,
                    "output": entry.output,
                    "error": entry.error,
                    "error_type": entry.error_type,
                    "duration_ms": entry.duration_ms,
                    "started_at": self.started_at[call_id],
                }
            )
        if rows:
            await cur.executemany(_INSERT_HELD, rows)


class PostgresToolLedger(ToolLedger):
    """The ledger in the `tool_ledger` table (server migration 0003), over the server's pool.

    The tool runtime owns these statements; the server only creates the table and hands the
    pool in, so `tools` never imports `server`.

    Args:
        pool: The server's pool.
        tenant_id: The run's tenant.
        held: Given on a run's first attempt only: where calls of tools that are safe to run
            again wait for their outcome's event (`HeldOutcomes`) instead of being claimed
            in the database first.
    """

    def __init__(
        self, pool: AsyncConnectionPool[Any], tenant_id: str, held: HeldOutcomes | None = None
    ) -> None:
        self._pool = pool
        self._tenant_id = tenant_id
        self._held = held
        self._claimed: set[str] = set()  # ids this attempt claimed in the database

    async def claim(
        self, entry: LedgerEntry, *, rerunnable: bool = False
    ) -> tuple[Claim, LedgerEntry]:
        """Insert `entry` as started unless a row exists; return what was found."""
        held = self._held
        if held is not None:
            found = held.entries.get(entry.tool_call_id)
            if found is not None:
                return _classify(found, entry.generation), found
            if rerunnable and entry.tool_call_id not in self._claimed and held.has_room():
                held.hold(entry)
                return Claim.NEW, entry
            self._claimed.add(entry.tool_call_id)
        async with self._pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                _CLAIM,
                {
                    "run_id": entry.run_id,
                    "tool_call_id": entry.tool_call_id,
                    "tenant_id": self._tenant_id,
                    "tool_name": entry.tool_name,
                    "args": Jsonb(entry.args),
                    "idempotency_key": entry.idempotency_key,
                    "generation": entry.generation,
                },
            )
            if cur.rowcount == 1:
                return Claim.NEW, entry
            await cur.execute(_SELECT, (entry.run_id, entry.tool_call_id))
            row = await cur.fetchone()
        assert row is not None, "a conflicting ledger row vanished"
        found = LedgerEntry(
            run_id=row["run_id"],
            tool_call_id=row["tool_call_id"],
            tool_name=row["tool_name"],
            args=row["args"],
            idempotency_key=row["idempotency_key"],
            status=row["status"],
            generation=row["generation"],
            attempts=row["attempts"],
            output=row["output"],
            error=row["error"],
            error_type=row["error_type"],
            duration_ms=row["duration_ms"],
        )
        return _classify(found, entry.generation), found

    async def take_over(self, run_id: str, tool_call_id: str, generation: int) -> bool:
        """Make an in-doubt row this attempt's (to run it again); False if someone else did."""
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                _TAKE_OVER,
                {"run_id": run_id, "tool_call_id": tool_call_id, "generation": generation},
            )
            return bool(cur.rowcount == 1)

    async def store(
        self, run_id: str, tool_call_id: str, generation: int, outcome: Outcome
    ) -> bool:
        """Store the outcome of a call; False when the row is no longer this attempt's.

        A held call's outcome is kept with it, and written with its event.
        """
        held = self._held
        if held is not None and (found := held.entries.get(tool_call_id)) is not None:
            if found.status != "started" or found.generation != generation:
                return False
            held.record(found, outcome)
            return True
        async with self._pool.connection() as conn:
            cur = await conn.execute(
                _RECORD,
                {
                    "run_id": run_id,
                    "tool_call_id": tool_call_id,
                    "generation": generation,
                    "status": outcome.status,
                    "attempts": outcome.attempts,
                    "output": outcome.output,
                    "error": outcome.error,
                    "error_type": outcome.error_type,
                    "duration_ms": outcome.duration_ms,
                },
            )
            return bool(cur.rowcount == 1)
