"""Log lines carry the run, tenant, trace and span they belong to."""

from __future__ import annotations

import json
import logging

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from server.observability.logs import (
    ContextFilter,
    HumanFormatter,
    JsonFormatter,
    current_span_ids,
    run_context,
)


def make_record(message: str) -> logging.LogRecord:
    record = logging.LogRecord("agentrt.test", logging.INFO, __file__, 1, message, None, None)
    ContextFilter().filter(record)
    return record


def test_json_lines_carry_run_and_trace_ids() -> None:
    tracer = TracerProvider().get_tracer("test")
    token = run_context.set({"run_id": "run_1", "tenant_id": "acme"})
    try:
        with tracer.start_as_current_span("work") as span:
            record = make_record("step done")
            ids = span.get_span_context()
    finally:
        run_context.reset(token)
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "step done" and entry["level"] == "info"
    assert entry["run_id"] == "run_1" and entry["tenant_id"] == "acme"
    assert entry["trace_id"] == f"{ids.trace_id:032x}"
    assert entry["span_id"] == f"{ids.span_id:016x}"


def test_lines_outside_a_run_have_no_run_fields() -> None:
    assert trace.get_current_span().get_span_context().is_valid is False
    entry = json.loads(JsonFormatter().format(make_record("idle")))
    assert "run_id" not in entry and "trace_id" not in entry
    assert "[run" not in HumanFormatter("%(message)s").format(make_record("idle"))


def test_lines_inside_a_run_attempt_carry_its_span() -> None:
    token = current_span_ids.set((0xABC, 0x12))
    try:
        entry = json.loads(JsonFormatter().format(make_record("tool called")))
    finally:
        current_span_ids.reset(token)
    assert entry["trace_id"] == f"{0xABC:032x}" and entry["span_id"] == f"{0x12:016x}"
