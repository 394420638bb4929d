"""Logging: one JSON object per line for machines, a readable line for people.

Every record carries the run id and tenant of the run being executed (a context variable
the executor sets) and the current trace and span ids.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from opentelemetry import trace

run_context: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "agentrt_run_context", default=None
)
# The trace and span ids of the run attempt being executed (server/observability/tracing.py).
current_span_ids: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "agentrt_span_ids", default=None
)


class ContextFilter(logging.Filter):
    """Attach run id, tenant, trace id and span id to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Add the current run's ids to the record; never filter it out."""
        ctx = run_context.get() or {}
        record.run_id = ctx.get("run_id", "")
        record.tenant_id = ctx.get("tenant_id", "")
        ids = current_span_ids.get()
        if ids is None:  # code traced by OpenTelemetry's own API (a library's instrumentation)
            span = trace.get_current_span().get_span_context()
            ids = (span.trace_id, span.span_id) if span.is_valid else None
        record.trace_id = "" if ids is None else f"{ids[0]:032x}"
        record.span_id = "" if ids is None else f"{ids[1]:016x}"
        return True


class JsonFormatter(logging.Formatter):
    """Format a record as one JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        """Render the record as one JSON object."""
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in ("run_id", "tenant_id", "trace_id", "span_id"):
            value = getattr(record, key, "")
            if value:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class HumanFormatter(logging.Formatter):
    """A readable line, with the run and trace when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        """Render the record as one human-readable line."""
        line = super().format(record)
        run_id = getattr(record, "run_id", "")
        if run_id:
            line += f"  [run {run_id} trace {getattr(record, 'trace_id', '')}]"
        return line


def setup_logging(level: str, fmt: str) -> None:
    """Configure the root logger; `fmt` is `json`, `text`, or `auto` (JSON unless a terminal)."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler = logging.StreamHandler()
    handler.addFilter(ContextFilter())
    handler.setFormatter(
        JsonFormatter()
        if use_json
        else HumanFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("pgserver", "httpx", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
