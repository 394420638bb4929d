"""Traces of runs: spans always stored in Postgres, also exported over OpenTelemetry when set.

A run's trace id and root span id are derived from its run id, so every attempt (in whatever
process) joins the same trace; the root span itself is emitted when the run ends. Spans for
nodes, model calls and tool calls come from a LangChain callback handler, so nodes need no
tracing code of their own.

Spans are recorded by `RunSpan`, a plain record: a run makes about ten of them, and the
OpenTelemetry SDK's spans (sampling, context objects, attribute checks, locks) cost more than
everything else the trace does. When an exporter is configured (OTLP, or one passed in), each
ended span is also handed to it as the SDK's `ReadableSpan`, with the same ids and links
(docs/decisions/2006).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from server import jsontext
from server.db.pool import Conn, Pool
from server.domain import Run
from server.observability.logs import current_span_ids
from server.observability.metrics import Metrics
from server.settings import Settings

log = logging.getLogger(__name__)


def run_trace_id(run_id: str) -> int:
    """The trace id of a run: the same in every process and attempt."""
    return int(hashlib.sha256(f"trace:{run_id}".encode()).hexdigest()[:32], 16)


def run_root_span_id(run_id: str) -> int:
    """The span id of a run's root span."""
    return int(hashlib.sha256(f"root:{run_id}".encode()).hexdigest()[:16], 16)


def hex_trace_id(run_id: str) -> str:
    """The run's trace id as the 32 hex digits tracing backends show."""
    return f"{run_trace_id(run_id):032x}"


def cut(text: str, limit: int) -> tuple[str, bool]:
    """Cut `text` to `limit` characters; return it and whether it was cut."""
    if len(text) <= limit:
        return text, False
    return text[:limit] + f"… [cut {len(text) - limit} characters]", True


def _dt(ns: int | None) -> datetime:
    return datetime.fromtimestamp((ns or 0) / 1e9, UTC)


@dataclass(eq=False)
class RunSpan:
    """A span of a run's trace: what it did, when, under which parent, and how it ended."""

    name: str
    trace_id: int
    span_id: int
    parent_id: int | None
    start_ns: int
    attributes: dict[str, Any]
    on_end: Callable[[RunSpan], None] = field(repr=False)
    events: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)
    error: str | None = None
    end_ns: int | None = None

    def set_attribute(self, key: str, value: Any) -> None:
        """Set an attribute; None is no value (as OpenTelemetry has it)."""
        if value is not None:
            self.attributes[key] = value

    def set_attributes(self, attributes: dict[str, Any]) -> None:
        """Set several attributes."""
        for key, value in attributes.items():
            self.set_attribute(key, value)

    def add_event(self, name: str, attributes: dict[str, Any] | None = None) -> None:
        """Record that something happened in the span, now."""
        self.events.append((name, time.time_ns(), dict(attributes or {})))

    def record_exception(self, exc: BaseException) -> None:
        """Record an exception as OpenTelemetry's `exception` event does."""
        kind = type(exc)
        module = kind.__module__
        self.add_event(
            "exception",
            {
                "exception.type": f"{module}.{kind.__qualname__}"
                if module and module != "builtins"
                else kind.__qualname__,
                "exception.message": str(exc),
                "exception.stacktrace": "".join(traceback.format_exception(exc)),
                "exception.escaped": "False",
            },
        )

    def set_error(self, description: str) -> None:
        """Mark the span as failed."""
        self.error = description

    def end(self, end_ns: int | None = None) -> None:
        """End the span (once) and hand it on."""
        if self.end_ns is None:
            self.end_ns = end_ns if end_ns is not None else time.time_ns()
            self.on_end(self)


@dataclass
class SpanBatch:
    """Span sets and payloads taken from the sink, to be written in one transaction.

    A set is one row of `trace_span_sets`: the spans of one trace (and run) that one take
    found, as a JSON array. Its id is drawn when it is made and kept when the batch is given
    back, so a set written again after a commit in doubt is skipped.
    """

    rows: list[dict[str, Any]] = field(default_factory=list)
    payloads: list[tuple[str, str, str, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.rows or self.payloads)

    def span_count(self) -> int:
        """How many spans the batch's sets hold."""
        return sum(row["span_count"] for row in self.rows)

    async def insert(self, conn: Conn, *, rows: bool = True) -> None:
        """Write the batch in the caller's transaction (pipelined or not; never COPY).

        The sets go in one statement, as one JSON array. With `rows=False`, only the
        payloads are written (the sets went by COPY).
        """
        async with conn.cursor() as cur:
            if self.rows and rows:
                await cur.execute(_INSERT_SETS, (jsontext.stored_bytes(self.rows, str).decode(),))
            if self.payloads:
                await cur.executemany(
                    "INSERT INTO trace_payloads (trace_id, span_id, kind, data)"
                    " VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    self.payloads,
                )


class PostgresSpanSink:
    """Collect finished spans (and full payloads) and write them to Postgres in batches.

    A run's end takes its trace's spans and writes them in the transaction of its final event
    (`take`), so most runs store their trace as one row; the background flush writes the
    spans of traces that have waited `hold_s` (a long run's, a run's whose process is
    stopping). Whatever a failed write took is given back for the next one, up to `keep_max`
    spans.
    """

    def __init__(self, pool: Pool, keep_max: int = 50_000, hold_s: float = 1.0) -> None:
        self._pool = pool
        self._keep_max = keep_max
        self._hold_ns = int(hold_s * 1e9)
        # Ended spans by trace, each trace's in the order they ended. Spans may end on any
        # thread: `_spans_lock` keeps a span from going into a list a take has just removed.
        self._spans: dict[int, list[RunSpan]] = {}
        self._spans_lock = threading.Lock()
        self._held = SpanBatch()  # taken by a write that failed: written by the next one
        self._lock = asyncio.Lock()

    def on_end(self, span: RunSpan) -> None:
        """Keep the ended span for the next flush."""
        with self._spans_lock:
            found = self._spans.get(span.trace_id)
            if found is None:
                self._spans[span.trace_id] = [span]
            else:
                found.append(span)

    def add_payload(self, trace_id: int, span_id: int, kind: str, text: str) -> None:
        """Keep the full input or output of a span (JSON text); its attribute holds a cut copy."""
        self._held.payloads.append((f"{trace_id:032x}", f"{span_id:016x}", kind, _no_nul(text)))

    def take(self, trace_id: int | None = None, *, settled: bool = False) -> SpanBatch:
        """Take the spans collected so far, with whatever a failed write gave back.

        `trace_id` takes that trace's spans only; `settled` only those of traces whose first
        waiting span ended `hold_s` ago or more. The others stay for a later take.
        """
        with self._spans_lock:
            if trace_id is not None:
                spans = self._spans.pop(trace_id, [])
            elif settled:
                ended_by = time.time_ns() - self._hold_ns
                due = [t for t, kept in self._spans.items() if (kept[0].end_ns or 0) <= ended_by]
                spans = [span for t in due for span in self._spans.pop(t)]
            else:
                spans = [span for kept in self._spans.values() for span in kept]
                self._spans = {}
        batch, self._held = self._held, SpanBatch()
        batch.rows += _span_sets(spans)
        return batch

    def give_back(self, batch: SpanBatch) -> None:
        """Keep a batch whose write failed for the next one (the newest `keep_max` spans)."""
        self._held.rows[:0] = batch.rows
        self._held.payloads[:0] = batch.payloads
        rows, payloads = self._held.rows, self._held.payloads
        over = self._held.span_count() - self._keep_max
        dropped = 0
        while over > 0 and rows:  # whole sets go, the oldest first
            over -= rows[0]["span_count"]
            dropped += rows.pop(0)["span_count"]
        if len(payloads) > self._keep_max:
            dropped += len(payloads) - self._keep_max
            del payloads[: len(payloads) - self._keep_max]
        if dropped:
            log.warning("dropping %d unstored spans and payloads", dropped)

    async def flush(self, trace_id: int | None = None, *, settled: bool = False) -> None:
        """Write what `take` finds (all of it by default) in one transaction."""
        async with self._lock:
            batch = self.take(trace_id, settled=settled)
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
                    async with conn.cursor() as cur, cur.copy(_COPY_SETS) as copy:
                        for row in batch.rows:
                            await copy.write_row(_copy_row(row))
                    await batch.insert(conn, rows=False)
                return
            except psycopg.errors.UniqueViolation:
                pass  # given back after a write whose commit was in doubt: insert, skipping those
        # A run's few sets: pipelined with no BEGIN, the statements up to the one Sync at the
        # end are a single implicit transaction sent in one round trip.
        async with self._pool.connection() as conn, conn.pipeline():
            await batch.insert(conn)

    async def run(self, interval_s: float) -> None:
        """Every `interval_s` until cancelled, write the spans that have waited long enough."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.flush(settled=True)
            except Exception:
                log.exception("storing spans failed; will retry")


# The spans go in as the JSON text the writer made (`spans_text`): `json_to_recordset` takes
# each set's array as it is in the batch's text, and COPY is given it (docs/decisions/2048).
_SET_COLUMNS = "trace_id, set_id, run_id, tenant_id, ended_at, span_count, spans"
_STORED_COLUMNS = _SET_COLUMNS.replace("spans", "spans_text")
# A batch given back after a failure whose commit was in doubt may hold sets already stored.
_INSERT_SETS = f"""
INSERT INTO trace_span_sets ({_STORED_COLUMNS})
SELECT {_SET_COLUMNS} FROM json_to_recordset(%s::json) AS s(
    trace_id text, set_id text, run_id text, tenant_id text, ended_at timestamptz,
    span_count integer, spans json)
ON CONFLICT DO NOTHING
"""
_COPY_SETS = f"COPY trace_span_sets ({_STORED_COLUMNS}) FROM STDIN"
_COLUMNS = tuple(c.strip() for c in _SET_COLUMNS.split(","))
# Up to this many sets go in one statement; more (a backlog) go through COPY.
_INSERT_MAX = 64


def _copy_row(row: dict[str, Any]) -> tuple[Any, ...]:
    """A set's row for COPY: NUL characters replaced, the spans as JSON text."""
    clean = jsontext.storable(row)
    return tuple(
        jsontext.dumps(clean[c], default=str) if c == "spans" else clean[c] for c in _COLUMNS
    )


def _no_nul(text: str) -> str:
    """JSON text with its escaped NUL characters replaced (jsonb refuses them)."""
    if jsontext.NUL_ESCAPE in text:
        text = jsontext.dumps(jsontext.storable(json.loads(text)))
    return text


# Attributes stored in a column of their own, and not again in the span's `attributes`:
# `stored_attributes` leaves them out, `read_attributes` puts them back.
COLUMN_ATTRIBUTES = {"run_id": "agentrt.run_id", "tenant_id": "agentrt.tenant_id"}


def stored_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    """A span's attributes as its row keeps them: less those its columns hold."""
    return {k: v for k, v in attributes.items() if k not in _IN_COLUMNS}


def read_attributes(row: dict[str, Any]) -> dict[str, Any]:
    """A stored span's attributes, those its columns hold included."""
    found = {key: row[column] for column, key in COLUMN_ATTRIBUTES.items() if row[column]}
    return {**found, **row["attributes"]}


_IN_COLUMNS = frozenset(COLUMN_ATTRIBUTES.values())


def _span_sets(spans: list[RunSpan]) -> list[dict[str, Any]]:
    """The spans as rows of `trace_span_sets`: one per trace, run and tenant, in end order."""
    sets: dict[tuple[int, Any, Any], list[RunSpan]] = {}
    for s in spans:
        attrs = s.attributes
        key = (s.trace_id, attrs.get("agentrt.run_id"), attrs.get("agentrt.tenant_id"))
        sets.setdefault(key, []).append(s)
    return [
        {
            "trace_id": f"{trace_id:032x}",
            "set_id": f"{random.getrandbits(64):016x}",
            "run_id": run_id,
            "tenant_id": tenant_id,
            # The set's date (its partition): its latest span's end, so that a run's last set,
            # whose root span started when the run was created, is kept as long as the rest.
            "ended_at": _dt(max(_end_ns(s) for s in members)).isoformat(),
            "span_count": len(members),
            "spans": [_span_row(s) for s in members],
        }
        for (trace_id, run_id, tenant_id), members in sets.items()
    ]


def _end_ns(s: RunSpan) -> int:
    return s.end_ns if s.end_ns is not None else s.start_ns


def _span_row(s: RunSpan) -> dict[str, Any]:
    """A span as its set holds it: JSON-ready, no null or empty members (NULs dealt with later)."""
    attrs = s.attributes
    end = _end_ns(s)
    row: dict[str, Any] = {
        "span_id": f"{s.span_id:016x}",
        "name": s.name,
        "kind": str(attrs.get("agentrt.kind", "internal")),
        "start_time": _dt(s.start_ns).isoformat(),
        "end_time": _dt(end).isoformat(),
        "duration_ms": (end - s.start_ns) / 1e6,
        "status": "unset" if s.error is None else "error",
        "attributes": stored_attributes(attrs),
    }
    if s.parent_id is not None:
        row["parent_span_id"] = f"{s.parent_id:016x}"
    if s.error is not None:
        row["error"] = s.error
    if s.events:
        row["events"] = [
            {"name": name, "ts": _dt(ts).isoformat(), "attributes": attributes}
            for name, ts, attributes in s.events
        ]
    return row


def _readable(s: RunSpan, resource: Resource) -> ReadableSpan:
    """The span as OpenTelemetry's SDK has it, for exporters."""
    flags = TraceFlags(TraceFlags.SAMPLED)
    parent = None
    if s.parent_id is not None:
        parent = SpanContext(s.trace_id, s.parent_id, is_remote=False, trace_flags=flags)
    return ReadableSpan(
        name=s.name,
        context=SpanContext(s.trace_id, s.span_id, is_remote=False, trace_flags=flags),
        parent=parent,
        resource=resource,
        # The SDK's checks, as its own spans would have them: what exporters can encode.
        attributes=BoundedAttributes(attributes=s.attributes, immutable=False),
        events=[Event(name, attributes, ts) for name, ts, attributes in s.events],
        kind=SpanKind.INTERNAL,
        status=Status(StatusCode.UNSET) if s.error is None else Status(StatusCode.ERROR, s.error),
        start_time=s.start_ns,
        end_time=s.end_ns,
        instrumentation_scope=InstrumentationScope("agentrt"),
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
    """The process's spans: stored in Postgres always, exported over OpenTelemetry when set."""

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
        self.resource = Resource.create({"service.name": settings.service_name})
        self._processors: list[SpanProcessor] = []
        if settings.otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            self._processors.append(
                BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.otlp_endpoint))
            )
        self._processors += [SimpleSpanProcessor(exporter) for exporter in exporters]
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
        for processor in self._processors:
            await asyncio.to_thread(processor.shutdown)

    def span(
        self,
        name: str,
        parent: RunSpan | tuple[int, int],
        attributes: dict[str, Any],
        start_ns: int | None = None,
    ) -> RunSpan:
        """Start a span under `parent` (a span, or the trace and span ids of one elsewhere)."""
        trace_id, parent_id = (
            (parent.trace_id, parent.span_id) if isinstance(parent, RunSpan) else parent
        )
        span = RunSpan(
            name,
            trace_id,
            random.getrandbits(64) or 1,
            parent_id,
            time.time_ns() if start_ns is None else start_ns,
            {k: v for k, v in attributes.items() if v is not None},
            self._ended,
        )
        return span

    def _ended(self, span: RunSpan) -> None:
        self.sink.on_end(span)
        if self._processors:
            readable = _readable(span, self.resource)
            for processor in self._processors:
                processor.on_end(readable)

    @staticmethod
    def root_of(run_id: str) -> tuple[int, int]:
        """The trace and span ids of the run's root span (wherever it will be emitted)."""
        return run_trace_id(run_id), run_root_span_id(run_id)

    @contextmanager
    def attempt(self, info: RunInfo) -> Iterator[RunSpan]:
        """Open the span of one attempt of a run; log lines inside carry its ids."""
        span = self.span(
            "run.attempt",
            self.root_of(info.run_id),
            {**info.attributes(), "agentrt.kind": "attempt"},
        )
        token = current_span_ids.set((span.trace_id, span.span_id))
        try:
            yield span
        finally:
            current_span_ids.reset(token)
            span.end()

    def end_run(self, run: Run, status: str, error: str | None) -> None:
        """Emit the run's root span, from its creation to now."""
        trace_id, span_id = self.root_of(run.id)
        attributes = {
            "agentrt.run_id": run.id,
            "agentrt.conversation_id": run.conversation_id,
            "agentrt.tenant_id": run.tenant_id,
            "agentrt.user_id": run.user_id,
            "agentrt.kind": "run",
            "agentrt.status": status,
            "agentrt.model": run.model,
        }
        span = RunSpan(
            "run",
            trace_id,
            span_id,
            None,
            int(run.created_at.timestamp() * 1e9),
            {k: v for k, v in attributes.items() if v is not None},
            self._ended,
        )
        if error:
            span.set_error(error)
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
        span = self.span(
            name,
            self.root_of(run_id),
            {"agentrt.run_id": run_id, **attributes},
            int(start.timestamp() * 1e9),
        )
        if error:
            span.set_error(error)
        span.end(int(end.timestamp() * 1e9))
