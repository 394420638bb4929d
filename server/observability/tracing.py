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
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

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
from psycopg import AsyncCursor

from server.db.pool import Pool
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


class PostgresSpanSink(SpanProcessor):
    """Collect finished spans (and full payloads) and write them to Postgres in batches."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._spans: list[ReadableSpan] = []
        self._payloads: list[tuple[str, str, str, str]] = []
        self._lock = asyncio.Lock()

    def on_end(self, span: ReadableSpan) -> None:
        """Keep the ended span for the next flush."""
        self._spans.append(span)  # list.append is atomic; spans may end on any thread

    def add_payload(self, trace_id: int, span_id: int, kind: str, data: Any) -> None:
        """Keep the full input or output of a span, whose attribute holds a cut copy."""
        self._payloads.append(
            (f"{trace_id:032x}", f"{span_id:016x}", kind, json.dumps(data, default=str))
        )

    async def flush(self) -> None:
        """Write what has been collected so far, in one transaction."""
        async with self._lock:
            spans, self._spans = self._spans, []
            payloads, self._payloads = self._payloads, []
            if not spans and not payloads:
                return
            rows = [_span_row(s) for s in spans]
            async with self._pool.connection() as conn:
                if len(rows) > _INSERT_MAX:
                    async with conn.transaction(), conn.cursor() as cur:
                        async with cur.copy(
                            f"COPY trace_spans ({_SPAN_COLUMNS}) FROM STDIN"
                        ) as copy:
                            for row in rows:
                                await copy.write_row(row)
                        await _insert_payloads(cur, payloads)
                    return
                # A run's few spans: pipelined with no BEGIN, the statements up to the one Sync
                # at the end are a single implicit transaction sent in one round trip.
                async with conn.pipeline(), conn.cursor() as cur:
                    if rows:
                        await cur.executemany(_INSERT_SPAN, rows)
                    await _insert_payloads(cur, payloads)

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
_INSERT_SPAN = f"INSERT INTO trace_spans ({_SPAN_COLUMNS}) VALUES ({', '.join(['%s'] * 14)})"
# Up to this many spans go in one pipeline of INSERTs; more (a backlog) go through COPY.
_INSERT_MAX = 64


async def _insert_payloads(cur: AsyncCursor[Any], payloads: Sequence[tuple[str, ...]]) -> None:
    if payloads:
        await cur.executemany(
            "INSERT INTO trace_payloads (trace_id, span_id, kind, data)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
            payloads,
        )


def _span_row(s: ReadableSpan) -> tuple[Any, ...]:
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
    return (
        f"{ctx.trace_id:032x}",
        f"{ctx.span_id:016x}",
        f"{s.parent.span_id:016x}" if s.parent else None,
        attrs.get("agentrt.run_id"),
        attrs.get("agentrt.tenant_id"),
        s.name,
        str(attrs.get("agentrt.kind", "internal")),
        _dt(start),
        _dt(end),
        (end - start) / 1e6,
        s.status.status_code.name.lower(),
        error,
        json.dumps(attrs, default=str),
        json.dumps(events, default=str),
    )


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
