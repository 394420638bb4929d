"""Traces of runs: OpenTelemetry spans, always stored in Postgres, optionally sent over OTLP.

A run's trace id and root span id are derived from its run id, so every attempt (in whatever
process) joins the same trace; the root span itself is emitted when the run ends. Spans for
nodes, model calls and tool calls come from a LangChain callback handler, so nodes need no
tracing code of their own.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import json
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    Status,
    StatusCode,
    TraceFlags,
)

from server.db.pool import Conn, Pool
from server.domain import Run
from server.observability.metrics import Metrics
from server.settings import Settings

log = logging.getLogger(__name__)

_forced_ids: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "agentrt_forced_ids", default=None
)


def run_trace_id(run_id: str) -> int:
    """The trace id of a run: the same in every process and attempt."""
    return int(hashlib.sha256(f"trace:{run_id}".encode()).hexdigest()[:32], 16)


def run_root_span_id(run_id: str) -> int:
    """The span id of a run's root span."""
    return int(hashlib.sha256(f"root:{run_id}".encode()).hexdigest()[:16], 16)


def hex_trace_id(run_id: str) -> str:
    """The run's trace id as the 32 hex digits tracing backends show."""
    return f"{run_trace_id(run_id):032x}"


class _RunIdGenerator(RandomIdGenerator):
    """Random ids, except for a run's root span, whose ids come from the run id."""

    def generate_trace_id(self) -> int:
        forced = _forced_ids.get()
        return forced[0] if forced else super().generate_trace_id()

    def generate_span_id(self) -> int:
        forced = _forced_ids.get()
        return forced[1] if forced else super().generate_span_id()


def cut(text: str, limit: int) -> tuple[str, bool]:
    """Cut `text` to `limit` characters; return it and whether it was cut."""
    if len(text) <= limit:
        return text, False
    return text[:limit] + f"… [cut {len(text) - limit} characters]", True


def _dt(ns: int | None) -> datetime:
    return datetime.fromtimestamp((ns or 0) / 1e9, UTC)


@dataclass
class SpanBatch:
    """Spans and payloads taken from the sink, to be written in one transaction."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    payloads: list[tuple[str, str, str, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.rows or self.payloads)

    async def insert(self, conn: Conn, *, rows: bool = True) -> None:
        """Write the batch in the caller's transaction (pipelined or not; never COPY).

        The spans go in one statement, as one JSON array. With `rows=False`, only the
        payloads are written (the spans went by COPY).
        """
        async with conn.cursor() as cur:
            if self.rows and rows:
                await cur.execute(_INSERT_SPANS, (_no_nul(json.dumps(self.rows, default=str)),))
            if self.payloads:
                await cur.executemany(
                    "INSERT INTO trace_payloads (trace_id, span_id, kind, data)"
                    " VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    self.payloads,
                )


class PostgresSpanSink(SpanProcessor):
    """Collect finished spans (and full payloads) and write them to Postgres in batches.

    A run's end takes what has been collected and writes it in the transaction of its final
    event (`take`); the background flush writes the rest. Whatever a failed write took is
    given back for the next one, up to `keep_max` rows.
    """

    def __init__(self, pool: Pool, keep_max: int = 50_000) -> None:
        self._pool = pool
        self._keep_max = keep_max
        self._spans: list[ReadableSpan] = []
        self._held = SpanBatch()  # taken by a write that failed: written by the next one
        self._lock = asyncio.Lock()

    def on_end(self, span: ReadableSpan) -> None:
        """Keep the ended span for the next flush."""
        self._spans.append(span)  # list.append is atomic; spans may end on any thread

    def add_payload(self, trace_id: int, span_id: int, kind: str, text: str) -> None:
        """Keep the full input or output of a span (JSON text); its attribute holds a cut copy."""
        self._held.payloads.append((f"{trace_id:032x}", f"{span_id:016x}", kind, _no_nul(text)))

    def take(self) -> SpanBatch:
        """Take everything collected so far; give it back if its write fails."""
        spans, self._spans = self._spans, []
        batch, self._held = self._held, SpanBatch()
        batch.rows += [_span_row(s) for s in spans]
        return batch

    def give_back(self, batch: SpanBatch) -> None:
        """Keep a batch whose write failed for the next one (the newest `keep_max` rows)."""
        self._held.rows[:0] = batch.rows
        self._held.payloads[:0] = batch.payloads
        for kept in (self._held.rows, self._held.payloads):
            if len(kept) > self._keep_max:
                log.warning("dropping %d unstored trace rows", len(kept) - self._keep_max)
                del kept[: len(kept) - self._keep_max]

    async def flush(self) -> None:
        """Write what has been collected so far, in one transaction."""
        async with self._lock:
            batch = self.take()
            if not batch:
                return
            try:
                await self._write(batch)
            except (psycopg.OperationalError, asyncio.CancelledError):
                self.give_back(batch)  # the database was away: the next flush writes it
                raise

    async def _write(self, batch: SpanBatch) -> None:
        if len(batch.rows) > _INSERT_MAX:
            try:
                async with self._pool.connection() as conn, conn.transaction():
                    async with conn.cursor() as cur, cur.copy(_COPY_SPANS) as copy:
                        for row in batch.rows:
                            await copy.write_row(_copy_row(row))
                    await batch.insert(conn, rows=False)
                return
            except psycopg.errors.UniqueViolation:
                pass  # given back after a write whose commit was in doubt: insert, skipping those
        # A run's few spans: pipelined with no BEGIN, the statements up to the one Sync at the
        # end are a single implicit transaction sent in one round trip.
        async with self._pool.connection() as conn, conn.pipeline():
            await batch.insert(conn)

    async def run(self, interval_s: float) -> None:
        """Flush every `interval_s` until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.flush()
            except Exception:
                log.exception("storing spans failed; will retry")


_SPAN_COLUMNS = (
    "trace_id, span_id, parent_span_id, run_id, tenant_id, name, kind, start_time, end_time,"
    " duration_ms, status, error, attributes, events"
)
# A batch given back after a failure whose commit was in doubt may hold rows already stored.
_INSERT_SPANS = f"""
INSERT INTO trace_spans ({_SPAN_COLUMNS})
SELECT {_SPAN_COLUMNS} FROM jsonb_to_recordset(%s::jsonb) AS s(
    trace_id text, span_id text, parent_span_id text, run_id text, tenant_id text, name text,
    kind text, start_time timestamptz, end_time timestamptz, duration_ms double precision,
    status text, error text, attributes jsonb, events jsonb)
ON CONFLICT DO NOTHING
"""
_COPY_SPANS = f"COPY trace_spans ({_SPAN_COLUMNS}) FROM STDIN"
_COLUMNS = tuple(c.strip() for c in _SPAN_COLUMNS.split(","))
# Up to this many spans go in one statement; more (a backlog) go through COPY.
_INSERT_MAX = 64


def _copy_row(row: dict[str, Any]) -> tuple[Any, ...]:
    """A span's row for COPY: NUL characters replaced, JSON columns as text."""
    clean = _clean(row)
    return tuple(_json(clean[c]) if c in ("attributes", "events") else clean[c] for c in _COLUMNS)


def _clean(value: Any) -> Any:
    """`value` with its NUL characters replaced: Postgres text and jsonb cannot hold one."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _json(value: Any) -> str:
    """JSON for a jsonb column, with no escaped NUL (a span must not fail the run's end)."""
    return _no_nul(json.dumps(value, default=str))


def _no_nul(text: str) -> str:
    """JSON text with its escaped NUL characters replaced (jsonb refuses them)."""
    if "\\u0000" in text:
        text = json.dumps(_clean(json.loads(text)))
    return text


def _span_row(s: ReadableSpan) -> dict[str, Any]:
    """A span's row as JSON-ready values (NUL characters are dealt with when it is written)."""
    attrs = dict(s.attributes or {})
    ctx = s.get_span_context()
    assert ctx is not None
    error = None
    if s.status.status_code == StatusCode.ERROR:
        error = s.status.description or "error"
    events = [
        {"name": e.name, "ts": _dt(e.timestamp).isoformat(), "attributes": dict(e.attributes or {})}
        for e in s.events
    ]
    start, end = s.start_time or 0, s.end_time or s.start_time or 0
    return {
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_span_id": f"{s.parent.span_id:016x}" if s.parent else None,
        "run_id": attrs.get("agentrt.run_id"),
        "tenant_id": attrs.get("agentrt.tenant_id"),
        "name": s.name,
        "kind": str(attrs.get("agentrt.kind", "internal")),
        "start_time": _dt(start).isoformat(),
        "end_time": _dt(end).isoformat(),
        "duration_ms": (end - start) / 1e6,
        "status": s.status.status_code.name.lower(),
        "error": error,
        "attributes": attrs,
        "events": events,
    }


@dataclass(frozen=True)
class RunInfo:
    """What every span of a run carries."""

    run_id: str
    conversation_id: str
    tenant_id: str
    attempt: int

    def attributes(self) -> dict[str, Any]:
        """Return the span attributes that name the run, its conversation, tenant and attempt."""
        return {
            "agentrt.run_id": self.run_id,
            "agentrt.conversation_id": self.conversation_id,
            "agentrt.tenant_id": self.tenant_id,
            "agentrt.attempt": self.attempt,
        }


class Tracing:
    """The process's tracer provider: Postgres always, OTLP when configured."""

    def __init__(
        self,
        pool: Pool,
        settings: Settings,
        metrics: Metrics,
        exporters: Sequence[SpanExporter] = (),
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.sink = PostgresSpanSink(pool)
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": settings.service_name}),
            id_generator=_RunIdGenerator(),
        )
        self.provider.add_span_processor(self.sink)
        if settings.otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            self.provider.add_span_processor(
                BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.otlp_endpoint))
            )
        for exporter in exporters:
            self.provider.add_span_processor(SimpleSpanProcessor(exporter))
        self.tracer = self.provider.get_tracer("agentrt")
        self._flusher: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start writing spans in the background."""
        self._flusher = asyncio.create_task(self.sink.run(1.0), name="span-flusher")

    async def stop(self) -> None:
        """Write what is left and shut the exporters down."""
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
        await self.sink.flush()
        await asyncio.to_thread(self.provider.shutdown)

    def root_context(self, run_id: str) -> Any:
        """A context whose parent is the run's root span (wherever it will be emitted)."""
        parent = SpanContext(
            run_trace_id(run_id),
            run_root_span_id(run_id),
            is_remote=True,
            trace_flags=TraceFlags(TraceFlags.SAMPLED),
        )
        return trace.set_span_in_context(NonRecordingSpan(parent))

    @contextmanager
    def attempt(self, info: RunInfo) -> Iterator[Span]:
        """Open the span of one attempt of a run, current for the code inside."""
        span = self.tracer.start_span(
            "run.attempt",
            context=self.root_context(info.run_id),
            attributes={**info.attributes(), "agentrt.kind": "attempt"},
        )
        with trace.use_span(
            span, end_on_exit=True, record_exception=False, set_status_on_exception=False
        ):
            yield span

    def end_run(self, run: Run, status: str, error: str | None) -> None:
        """Emit the run's root span, from its creation to now."""
        token = _forced_ids.set((run_trace_id(run.id), run_root_span_id(run.id)))
        try:
            span = self.tracer.start_span(
                "run",
                context=trace.set_span_in_context(trace.INVALID_SPAN),
                start_time=int(run.created_at.timestamp() * 1e9),
                attributes={
                    "agentrt.run_id": run.id,
                    "agentrt.conversation_id": run.conversation_id,
                    "agentrt.tenant_id": run.tenant_id,
                    "agentrt.user_id": run.user_id,
                    "agentrt.kind": "run",
                    "agentrt.status": status,
                    "agentrt.model": run.model,
                },
            )
        finally:
            _forced_ids.reset(token)
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()

    def record_span(
        self,
        run_id: str,
        name: str,
        start: datetime,
        end: datetime,
        attributes: dict[str, Any],
        error: str | None = None,
    ) -> None:
        """Record a finished span of a run that no single process watched from start to end.

        An approval wait is such a span: it lasts the run's whole suspension.
        """
        span = self.tracer.start_span(
            name,
            context=self.root_context(run_id),
            start_time=int(start.timestamp() * 1e9),
            attributes={"agentrt.run_id": run_id, **attributes},
        )
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=int(end.timestamp() * 1e9))
