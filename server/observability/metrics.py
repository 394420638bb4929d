"""Prometheus metrics: one registry per process, refreshed from Postgres at scrape time."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from graphs.events import EventType
from server.db.pool import Pool
from server.domain import ACTIVE, IN_PROGRESS, RunStatus, status_in

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_LONG = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
_STATUSES = tuple(s.value for s in RunStatus)
# The queue gauges, over every tenant (NULL) or one.
_QUEUE = f"""
SELECT count(*) FILTER (WHERE status = '{RunStatus.QUEUED.value}') AS depth,
    EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE status = '{RunStatus.QUEUED.value}'))
        ::float AS oldest,
    count(*) FILTER (WHERE {status_in(ACTIVE)} AND lease_expires_at < now()) AS expired
FROM runs WHERE (%(tenant)s::text IS NULL OR tenant_id = %(tenant)s) AND {status_in(IN_PROGRESS)}
"""


class Metrics:
    """Every metric agentrt exports.

    Counters and histograms count what this process did; gauges about runs and the queue are
    read from the database when scraped.
    """

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.runs = Gauge(
            "agentrt_runs", "Runs by status and tenant", ["status", "tenant"], registry=r
        )
        self.queue_depth = Gauge("agentrt_queue_depth", "Runs waiting to be claimed", registry=r)
        self.queue_oldest = Gauge(
            "agentrt_queue_oldest_age_seconds", "Age of the oldest queued run", registry=r
        )
        self.workers = Gauge("agentrt_workers", "Registered worker processes", registry=r)
        self.expired_leases = Gauge(
            "agentrt_expired_leases", "Active runs whose lease expired", registry=r
        )
        self.runs_finished = Counter(
            "agentrt_runs_finished_total",
            "Runs this process ended, by status and tenant",
            ["status", "tenant"],
            registry=r,
        )
        self.run_duration = Histogram(
            "agentrt_run_duration_seconds",
            "Run duration from creation to end",
            ["status"],
            buckets=_LONG,
            registry=r,
        )
        self.model_latency = Histogram(
            "agentrt_model_call_seconds",
            "Model call latency",
            ["provider", "model", "outcome"],
            buckets=_LATENCY,
            registry=r,
        )
        self.model_ttft = Histogram(
            "agentrt_model_ttft_seconds",
            "Model time to first token",
            ["provider", "model"],
            buckets=_LATENCY,
            registry=r,
        )
        self.tokens = Counter(
            "agentrt_tokens_total",
            "Tokens by provider, model and kind",
            ["provider", "model", "kind"],
            registry=r,
        )
        self.cost = Counter(
            "agentrt_cost_usd_total", "Model cost in USD", ["provider", "model"], registry=r
        )
        self.retries = Counter(
            "agentrt_model_retries_total", "Model call retries", ["provider", "model"], registry=r
        )
        self.breaker_open = Gauge(
            "agentrt_circuit_breaker_open",
            "1 while the circuit breaker is open",
            ["provider", "model"],
            registry=r,
        )
        self.tool_latency = Histogram(
            "agentrt_tool_call_seconds",
            "Tool call latency",
            ["tool", "outcome"],
            buckets=_LATENCY,
            registry=r,
        )
        self.tool_errors = Counter(
            "agentrt_tool_errors_total", "Failed tool calls", ["tool"], registry=r
        )
        self.sse_connections = Gauge("agentrt_sse_connections", "Open SSE streams", registry=r)
        self.events_written = Counter(
            "agentrt_events_written_total", "Events appended to run logs", registry=r
        )
        self.claims = Counter(
            "agentrt_worker_claims_total",
            "Claims this process's worker made, by whether they found a run (found, empty)",
            ["outcome"],
            registry=r,
        )
        self.approval_wait = Histogram(
            "agentrt_approval_wait_seconds",
            "Time runs waited for a human decision",
            buckets=_LONG,
            registry=r,
        )
        self.retention_removed = Counter(
            "agentrt_retention_removed_total",
            "What the retention job removed, by kind (events, spans, payloads, ledger, audit)",
            ["kind"],
            registry=r,
        )

    def observe_model_call(
        self,
        provider: str,
        model: str,
        seconds: float,
        ttft: float | None,
        usage: Mapping[str, Any],
        outcome: str,
    ) -> None:
        """Record one model call."""
        self.model_latency.labels(provider, model, outcome).observe(seconds)
        if ttft is not None:
            self.model_ttft.labels(provider, model).observe(ttft)
        details = usage.get("input_token_details") or {}
        out_details = usage.get("output_token_details") or {}
        for kind, value in (
            ("input", usage.get("input_tokens")),
            ("output", usage.get("output_tokens")),
            ("cached_input", details.get("cache_read")),
            ("reasoning", out_details.get("reasoning")),
        ):
            if value:
                self.tokens.labels(provider, model, kind).inc(value)

    def observe_event(self, kind: str, data: Mapping[str, Any]) -> None:
        """Count what the model layer reports through events: cost and retries."""
        if kind == EventType.USAGE:
            call = data.get("call") or {}
            if call.get("cost") is not None:
                self.cost.labels(call.get("provider", ""), call.get("model", "")).inc(
                    float(call["cost"])
                )
        elif kind == EventType.MODEL_RETRY:
            provider, _, model = str(data.get("model", "")).partition(":")
            self.retries.labels(provider, model).inc()

    def set_breakers(self, circuits: list[dict[str, Any]]) -> None:
        """Mirror the circuit breakers' states (`model` is "provider:model")."""
        for circuit in circuits:
            provider, _, model = str(circuit["model"]).partition(":")
            self.breaker_open.labels(provider, model).set(circuit["state"] == "open")

    def observe_tool_call(self, tool: str, seconds: float, outcome: str) -> None:
        """Record one tool call."""
        self.tool_latency.labels(tool, outcome).observe(seconds)
        if outcome != "ok":
            self.tool_errors.labels(tool).inc()

    def observe_run_end(self, tenant: str, status: str, seconds: float) -> None:
        """Record a run this process ended."""
        self.runs_finished.labels(status, tenant).inc()
        self.run_duration.labels(status).observe(seconds)

    async def refresh(self, pool: Pool) -> None:
        """Read the run and queue gauges from the database."""
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT tenant_id, status, count(*) AS n FROM runs GROUP BY tenant_id, status"
            )
            rows = await cur.fetchall()
            cur = await conn.execute(_QUEUE, {"tenant": None})
            queue = await cur.fetchone()
            cur = await conn.execute("SELECT count(*) AS n FROM workers")
            workers = await cur.fetchone()
        self.runs.clear()
        for tenant in {row["tenant_id"] for row in rows}:
            for status in _STATUSES:
                self.runs.labels(status, tenant).set(0)
        for row in rows:
            self.runs.labels(row["status"], row["tenant_id"]).set(row["n"])
        assert queue is not None and workers is not None
        self.queue_depth.set(queue["depth"] or 0)
        self.queue_oldest.set(queue["oldest"] or 0)
        self.expired_leases.set(queue["expired"] or 0)
        self.workers.set(workers["n"])

    async def scrape(self, pool: Pool, tenant: str | None, circuits: list[dict[str, Any]]) -> bytes:
        """Return the metrics in Prometheus text format, with the gauges read fresh.

        Args:
            pool: The pool the run and queue gauges are read with.
            tenant: Only this tenant's series; None for every series.
            circuits: The circuit breakers' states, shown to the installation only.
        """
        if tenant is not None:
            return await self.render_tenant(pool, tenant)
        await self.refresh(pool)
        self.set_breakers(circuits)
        return self.render()

    def render(self) -> bytes:
        """The registry in Prometheus text format."""
        return bytes(generate_latest(self.registry))

    async def render_tenant(self, pool: Pool, tenant: str) -> bytes:
        """Return one tenant's view in Prometheus text format.

        It holds the series labelled with the tenant, and the run and queue gauges counted
        over the tenant's runs only (labelled `tenant`). Series of the whole installation
        (workers, model and tool latency, tokens, cost) are left out: they mix tenants.
        """
        async with pool.connection() as conn:
            cur = await conn.execute(
                "SELECT status, count(*) AS n FROM runs WHERE tenant_id = %s GROUP BY status",
                (tenant,),
            )
            counts = {row["status"]: row["n"] for row in await cur.fetchall()}
            cur = await conn.execute(_QUEUE, {"tenant": tenant})
            queue = await cur.fetchone()
        assert queue is not None
        runs = GaugeMetricFamily(
            "agentrt_runs", "Runs by status and tenant", labels=["status", "tenant"]
        )
        for status in _STATUSES:
            runs.add_metric([status, tenant], counts.get(status, 0))
        gauges: list[Metric] = [runs]
        for name, doc, value in (
            ("agentrt_queue_depth", "Runs waiting to be claimed", queue["depth"]),
            ("agentrt_queue_oldest_age_seconds", "Age of the oldest queued run", queue["oldest"]),
            ("agentrt_expired_leases", "Active runs whose lease expired", queue["expired"]),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=["tenant"])
            gauge.add_metric([tenant], value or 0)
            gauges.append(gauge)
        view = CollectorRegistry(auto_describe=False)
        view.register(_TenantCollector(self.registry, tenant, gauges))
        return bytes(generate_latest(view))


class _TenantCollector(Collector):
    """The samples of `source` labelled with `tenant`, plus precomputed tenant gauges."""

    def __init__(self, source: CollectorRegistry, tenant: str, gauges: list[Metric]) -> None:
        self._source = source
        self._tenant = tenant
        self._gauges = gauges

    def collect(self) -> Iterable[Metric]:
        replaced = {g.name for g in self._gauges}
        for family in self._source.collect():
            if family.name in replaced:
                continue
            samples = [s for s in family.samples if s.labels.get("tenant") == self._tenant]
            if samples:
                kept = Metric(family.name, family.documentation, family.type, family.unit)
                kept.samples = samples
                yield kept
        yield from self._gauges
