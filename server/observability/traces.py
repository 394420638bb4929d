"""Reading a run's trace back: spans as a tree, the failing span, full payloads."""

from __future__ import annotations

import json
from typing import Any

from server.db.pool import Conn
from server.domain import Run, RunStatus
from server.observability.tracing import hex_trace_id, read_attributes, run_root_span_id


def _span_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "spanId": row["span_id"],
        "parentSpanId": row["parent_span_id"],
        "name": row["name"],
        "kind": row["kind"],
        "start": row["start_time"].isoformat(),
        "end": row["end_time"].isoformat(),
        "durationMs": round(row["duration_ms"], 3),
        "status": row["status"],
        "error": row["error"],
        "attributes": read_attributes(row),
        "events": row["events"],
        "children": [],
    }


def _synthetic_root(run: Run) -> dict[str, Any]:
    """The root span of a run that has not ended (or ended without a worker) yet."""
    end = run.finished_at or run.updated_at
    return {
        "spanId": f"{run_root_span_id(run.id):016x}",
        "parentSpanId": None,
        "name": "run",
        "kind": "run",
        "start": run.created_at.isoformat(),
        "end": end.isoformat() if run.finished_at else None,
        "durationMs": round((end - run.created_at).total_seconds() * 1000, 3),
        "status": "error" if run.status == RunStatus.FAILED else "unset",
        "error": run.error_message,
        "attributes": {"agentrt.run_id": run.id, "agentrt.status": run.status.value},
        "events": [],
        "children": [],
    }


async def load_trace(conn: Conn, run: Run) -> dict[str, Any]:
    """Return the run's span tree, with the deepest failed span named."""
    trace_id = hex_trace_id(run.id)
    cur = await conn.execute(
        "SELECT * FROM trace_spans WHERE trace_id = %s ORDER BY start_time, span_id", (trace_id,)
    )
    spans = {row["span_id"]: _span_view(row) for row in await cur.fetchall()}
    root_id = f"{run_root_span_id(run.id):016x}"
    root = spans.get(root_id) or _synthetic_root(run)
    spans[root_id] = root
    for span in spans.values():
        if span is root:
            continue
        parent = spans.get(span["parentSpanId"] or "", root)
        parent["children"].append(span)

    def deepest_error(span: dict[str, Any], depth: int) -> tuple[int, dict[str, Any]] | None:
        best = (depth, span) if span["status"] == "error" else None
        for child in span["children"]:
            found = deepest_error(child, depth + 1)
            if found and (best is None or found[0] > best[0]):
                best = found
        return best

    # Only a failed run has a failing span; errors a run recovered from show in the tree.
    failed = deepest_error(root, 0) if run.status == RunStatus.FAILED else None
    return {
        "runId": run.id,
        "traceId": trace_id,
        "spanCount": len(spans),
        "failedSpan": None
        if failed is None
        else {
            "spanId": failed[1]["spanId"],
            "name": failed[1]["name"],
            "error": failed[1]["error"],
        },
        "root": root,
    }


# A payload cut in its span's attribute is kept whole in `trace_payloads`; an uncut one is the
# attribute itself (JSON text of the payload, parsed here as it was written, by Python).
_PAYLOAD = """
SELECT
    (SELECT data FROM trace_payloads
     WHERE trace_id = %(trace)s AND span_id = %(span)s AND kind = %(kind)s) AS data,
    (SELECT attributes ->> %(attribute)s FROM trace_spans
     WHERE trace_id = %(trace)s AND span_id = %(span)s AND NOT attributes ? %(cut)s) AS text
"""


async def load_payload(conn: Conn, run_id: str, span_id: str, kind: str) -> dict[str, Any] | None:
    """Return the full input or output of a span of the run, if it was kept."""
    cur = await conn.execute(
        _PAYLOAD,
        {
            "trace": hex_trace_id(run_id),
            "span": span_id,
            "kind": kind,
            "attribute": f"agentrt.{kind}",
            "cut": f"agentrt.{kind}_truncated",
        },
    )
    row = await cur.fetchone()
    if row is None or (row["data"] is None and row["text"] is None):
        return None
    data = row["data"] if row["data"] is not None else json.loads(row["text"])
    return {"spanId": span_id, "kind": kind, "data": data}


def render_tree(trace: dict[str, Any]) -> str:
    """The trace as an indented tree for a terminal."""
    lines: list[str] = [f"trace {trace['traceId']}  run {trace['runId']}"]

    def walk(span: dict[str, Any], prefix: str, last: bool) -> None:
        mark = "!! " if span["status"] == "error" else ""
        attrs = span["attributes"]
        detail = []
        if span["kind"] == "model":
            detail.append(
                f"{attrs.get('gen_ai.request.model')} "
                f"in={attrs.get('gen_ai.usage.input_tokens')} "
                f"out={attrs.get('gen_ai.usage.output_tokens')}"
            )
            if "agentrt.ttft_ms" in attrs:
                detail.append(f"ttft={attrs['agentrt.ttft_ms']:.0f}ms")
        if span["error"]:
            detail.append(f"error: {span['error']}")
        branch = "└─ " if last else "├─ "
        text = f"{mark}{span['name']}  {span['durationMs']:.1f} ms  {' '.join(detail)}".rstrip()
        lines.append(prefix + branch + text)
        children = span["children"]
        for i, child in enumerate(children):
            walk(child, prefix + ("   " if last else "│  "), i == len(children) - 1)

    walk(trace["root"], "", True)
    return "\n".join(lines)
