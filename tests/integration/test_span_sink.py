"""The span sink stores what it collected: a run's few spans in one pipeline, a backlog by COPY."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider

from server.db.pool import Pool
from server.observability.tracing import PostgresSpanSink

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("count", [3, 200])
async def test_every_collected_span_and_payload_is_stored(pool: Pool, count: int) -> None:
    sink = PostgresSpanSink(pool)
    provider = TracerProvider()
    provider.add_span_processor(sink)
    tracer = provider.get_tracer("test")
    run_id = f"run_sink_{count}"
    with tracer.start_as_current_span("run", attributes={"agentrt.run_id": run_id}) as root:
        for n in range(count - 1):
            with tracer.start_as_current_span(f"step {n}", attributes={"agentrt.run_id": run_id}):
                pass
    trace_id = root.get_span_context().trace_id
    span_id = root.get_span_context().span_id
    sink.add_payload(trace_id, span_id, "input", {"text": "héllo", "n": 1})
    sink.add_payload(trace_id, span_id, "input", {"text": "a second copy is ignored"})

    await sink.flush()
    await sink.flush()  # nothing left: a no-op

    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n, count(DISTINCT span_id) AS ids FROM trace_spans"
            " WHERE run_id = %s",
            (run_id,),
        )
        assert await cur.fetchone() == {"n": count, "ids": count}
        cur = await conn.execute(
            "SELECT data FROM trace_payloads WHERE trace_id = %s", (f"{trace_id:032x}",)
        )
        assert [r["data"] for r in await cur.fetchall()] == [{"text": "héllo", "n": 1}]
