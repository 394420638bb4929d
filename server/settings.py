"""Settings: the only reader of the environment."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from server.loops import EventLoop
from tools.config import ToolConfig


class ModelPrice(BaseModel):
    """A price per million tokens for one model id, overriding litellm's price map."""

    model_config = ConfigDict(extra="forbid")

    input_per_mtok: Decimal = Field(ge=0)
    output_per_mtok: Decimal = Field(ge=0)
    cached_input_per_mtok: Decimal | None = Field(default=None, ge=0)


class RouteRule(BaseModel):
    """Pick `model` for a run that gave none, when every condition set here holds.

    Conditions: the message has at least `min_chars` / at most `max_chars` characters, and the
    run declares every capability in `needs` (e.g. "reasoning", from run options or a skill).
    """

    model_config = ConfigDict(extra="forbid")

    model: str
    min_chars: int | None = Field(default=None, ge=0)
    max_chars: int | None = Field(default=None, ge=0)
    needs: list[str] = Field(default_factory=list)


class Settings(BaseSettings):
    """Runtime configuration, read once at start-up from `AGENTRT_*` variables and `.env`."""

    model_config = SettingsConfigDict(env_prefix="AGENTRT_", env_file=".env", extra="ignore")

    environment: Literal["local", "test", "production"] = "local"
    host: str = "127.0.0.1"
    port: int = 8000
    # Idle keep-alive connections are closed after this long. Keep it above the idle timeout
    # of any load balancer or client pool in front (60 s is common): a server that closes
    # first races the client's next request on that connection, which then fails.
    http_keep_alive_s: int = Field(default=75, ge=1)
    # The processes' event loop (server/loops.py): "auto" is uvloop where it is installed.
    event_loop: EventLoop = "auto"

    # Unprefixed on purpose: DATABASE_URL is what every hosting platform sets.
    database_url: str | None = Field(default=None, validation_alias="DATABASE_URL")
    data_dir: Path = Path(".agentrt")
    db_pool_min: int = 2
    db_pool_max: int = 20
    # How long a request waits for a pooled connection before it is answered 503.
    db_pool_timeout_s: float = Field(default=30.0, gt=0)

    auth_enabled: bool = False
    default_tenant: str = "default"
    default_user: str = "local"

    default_model: str = "demo"
    # Agent profiles declared in files (`*.yaml`), synced into the database at start-up.
    agents_dir: Path = Path("agents")
    # The profile (declared in agents_dir) that `langgraph dev` runs (server/devgraph.py).
    dev_agent: str = "default"
    demo_token_delay_ms: int = 15
    scripted_models_file: Path | None = None
    max_steps: int = 12
    # Routing (docs/api-usage.md): run request > conversation > first matching rule > default.
    model_routes: list[RouteRule] = Field(default_factory=list)
    # Fallbacks tried in order when a model fails with a retryable error after its retries;
    # keyed by model id, "*" for any model.
    model_fallbacks: dict[str, list[str]] = Field(default_factory=dict)

    # Providers. `openai:<model>` talks to OpenAI or any OpenAI-compatible server (vLLM,
    # Ollama, LM Studio, a LiteLLM proxy) at `openai_base_url`.
    openai_api_key: SecretStr | None = None
    openai_base_url: str | None = None
    openai_models: list[str] = Field(default_factory=list)  # allow-list; empty allows any
    # `litellm:<provider>/<model>` reaches what litellm reaches (Anthropic, Gemini, Bedrock...).
    litellm_enabled: bool = False
    litellm_api_base: str | None = None
    litellm_api_key: SecretStr | None = None
    litellm_models: list[str] = Field(default_factory=list)  # allow-list; empty allows any
    # litellm fetches its price map from the network at import unless told not to; the copy
    # bundled with the installed litellm is used by default (offline, reproducible).
    litellm_remote_price_map: bool = False

    # Model faults: attempts per model, backoff with jitter, timeouts, breaker.
    model_max_attempts: int = Field(default=3, ge=1, le=10)
    model_backoff_base_s: float = Field(default=0.5, ge=0)
    model_backoff_max_s: float = Field(default=20.0, ge=0)
    model_retry_after_max_s: float = Field(default=60.0, ge=0)
    model_timeout_s: float = Field(default=120.0, gt=0)
    model_ttft_timeout_s: float = Field(default=30.0, gt=0)
    model_retry_after_partial: bool = True
    breaker_failure_threshold: int = Field(default=5, ge=1)
    breaker_cooldown_s: float = Field(default=30.0, gt=0)

    # Cost: prices per model id override litellm's map (self-hosted, negotiated).
    model_prices: dict[str, ModelPrice] = Field(default_factory=dict)
    # Budgets per run; a run option may lower them, never raise them. None: no limit.
    budget_max_tokens: int | None = Field(default=None, ge=1)
    budget_max_cost: Decimal | None = Field(default=None, ge=0)
    budget_max_model_calls: int | None = Field(default=None, ge=1)
    max_message_chars: int = 100_000
    # Request bodies over this are refused with 413 before they are read (or while read).
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    # A conversation's metadata, as JSON; it is returned on every read of the conversation.
    max_metadata_bytes: int = Field(default=16_384, ge=0)

    fetch_allowlist: list[str] = ["example.com", "httpbin.org"]
    # Extra tools to load, as "package.module:attribute" (a BaseTool or a list of them);
    # comma-separated in the environment, e.g. AGENTRT_TOOL_MODULES=mytools:send_note,b:c.
    tool_modules: Annotated[list[str], NoDecode] = []
    tool_timeout_s: float = 30.0
    tool_max_output_chars: int = 16_000
    # Per-tenant tool policy and MCP servers (JSON; see docs/tools.md).
    tool_config: ToolConfig = Field(default_factory=ToolConfig)
    # Hosts that MCP servers configured through the API may be on; stdio servers can only be
    # configured here, by the operator. Empty: the API cannot add MCP servers.
    mcp_api_allowed_hosts: list[str] = []
    mcp_discovery_ttl_s: float = 300.0

    # Long-term memory (docs/memory.md). Embeddings: `lexical:v1` (offline, not semantic),
    # `openai:<model>` (at openai_base_url) or `litellm:<provider>/<model>`. The store's vector
    # column has `embedding_dims` numbers: changing model or size needs a re-embedding.
    embedding_model: str = "lexical:v1"
    embedding_dims: int = Field(default=256, ge=8, le=2000)
    # Send `dimensions` to the provider (OpenAI's text-embedding-3 models shorten vectors).
    embedding_send_dims: bool = True
    embedding_batch_size: int = Field(default=64, ge=1, le=2048)
    # The memory store's vector index: `hnsw`, `flat` (exact scan, no index), or `auto`:
    # HNSW, except on the embedded Postgres when this CPU cannot run its pgvector build.
    memory_index: Literal["auto", "hnsw", "flat"] = "auto"
    # The model extracting memories when the profile names none; the run's model when unset.
    memory_extraction_model: str | None = None
    memory_poll_seconds: float = Field(default=2.0, gt=0)
    memory_lease_seconds: float = Field(default=60.0, gt=0)
    memory_max_attempts: int = Field(default=5, ge=1)

    run_workers: bool = True
    worker_concurrency: int = 16
    lease_seconds: float = 10.0
    worker_poll_seconds: float = 2.0
    # How long an idle worker leaves a run to the worker its ticket names before it looks
    # whether the run is still queued (server/runs/tickets.py, docs/decisions/2055).
    worker_ticket_grace_s: float = Field(default=0.25, gt=0)
    # A run's event writer: a step's reports and a tool call's start wait up to
    # `event_linger_s` for a checkpoint write to carry them (docs/decisions/2032); stream
    # pieces are stored at most every `event_pace_s`.
    event_linger_s: float = Field(default=0.2, gt=0)
    event_pace_s: float = Field(default=0.025, gt=0)
    # A run's step writes, and the checkpoint of a step a later attempt may run again at no
    # cost (building the context, the tools' step), wait up to this long for the next
    # checkpoint write to go in its transaction; 0: each is stored at once.
    checkpoint_hold_s: float = Field(default=0.1, ge=0)

    drain_grace_s: float = 20.0
    max_recoveries: int = 3
    run_timeout_s: float = 3600.0

    # Concurrent active (running) runs; over the limit runs wait in `queued` or, with
    # limit_policy "reject", the request is refused with 429.
    user_max_active_runs: int = 8
    tenant_max_active_runs: int = 64
    tenant_limits: dict[str, dict[str, int]] = Field(
        default_factory=dict,
        description='Per-tenant overrides: {"acme": {"userMaxActiveRuns": 2, '
        '"tenantMaxActiveRuns": 10}}',
    )
    limit_policy: Literal["queue", "reject"] = "queue"
    conversation_busy_policy: Literal["enqueue", "reject", "interrupt"] = "enqueue"

    checkpoint_retention_days: float = 7.0
    prune_interval_s: float = 3600.0

    sse_heartbeat_s: float = 15.0
    sse_replay_page: int = 5000
    # Frames of each live run kept in memory for its streams (server/events/sse.py RunFeed).
    sse_feed_keep: int = 10_000

    @field_validator("tool_modules", mode="before")
    @classmethod
    def _split_tool_modules(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):  # a JSON list also works
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _refuse_unsafe_production(self) -> Settings:
        if self.environment == "production":
            if not self.auth_enabled:
                raise ValueError("AGENTRT_AUTH_ENABLED must be true in production")
            if self.database_url is None:
                raise ValueError("DATABASE_URL must point at a managed Postgres in production")
        return self

    # Client side (`agentrt run`, `agentrt runs ...`): which server to talk to, and as whom.
    url: str = "http://127.0.0.1:8000"
    api_key: str | None = None
    log_level: str = "INFO"
    log_format: Literal["auto", "json", "text"] = "auto"

    # Traces are always stored in Postgres; also sent over OTLP/HTTP when this is set,
    # e.g. http://localhost:4318/v1/traces (Jaeger, Tempo, Langfuse, Phoenix...).
    otlp_endpoint: str | None = None
    service_name: str = "agentrt"
    trace_payload_chars: int = 4000
    redact_fields: list[str] = ["password", "api_key", "apikey", "token", "secret", "authorization"]
    # Worker processes (`agentrt worker`) serve /metrics on this port when set.
    metrics_port: int | None = None

    # Artifacts (docs/artifacts.md): files tools write. `local` keeps them under
    # `artifact_dir` (default: <data_dir>/artifacts); `s3` in an S3-compatible bucket.
    artifact_storage: Literal["local", "s3"] = "local"
    artifact_dir: Path | None = None
    artifact_s3_bucket: str | None = None
    artifact_s3_prefix: str = ""
    artifact_s3_endpoint_url: str | None = None  # MinIO, R2, GCS: their S3 endpoint
    artifact_s3_region: str | None = None
    artifact_s3_access_key_id: str | None = None  # unset: boto3's usual credential chain
    artifact_s3_secret_access_key: SecretStr | None = None
    artifact_s3_addressing_style: Literal["auto", "virtual", "path"] = "auto"
    # Parts of a multipart upload (S3's minimum is 5 MiB); one part is held in memory.
    artifact_part_bytes: int = Field(default=8 * 1024 * 1024, ge=5 * 1024 * 1024)
    artifact_max_bytes: int = Field(default=5 * 1024**3, ge=1)
    # Lifetime of the signed URLs `GET /api/artifacts/{id}/url` hands out (object storage).
    artifact_url_ttl_s: int = Field(default=300, ge=1, le=7 * 86_400)
    # The folder `write_artifact(from_file=...)` may read; unset: tools pass text only.
    artifact_file_root: Path | None = None
    # Versions older than this are deleted by `agentrt db prune` (None: kept); per tenant:
    # {"acme": 30}; a tenant mapped to null keeps its artifacts.
    artifact_retention_days: float | None = Field(default=None, gt=0)
    artifact_retention_by_tenant: dict[str, float | None] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _artifact_storage_is_complete(self) -> Settings:
        if self.artifact_storage == "s3" and not self.artifact_s3_bucket:
            raise ValueError("AGENTRT_ARTIFACT_S3_BUCKET must name a bucket when storage is s3")
        return self

    def artifact_retention_for(self, tenant_id: str) -> float | None:
        """Return the days a tenant's artifact versions are kept (None: for ever)."""
        if tenant_id in self.artifact_retention_by_tenant:
            return self.artifact_retention_by_tenant[tenant_id]
        return self.artifact_retention_days

    # Skill packages synced at start-up (every tenant sees them); docs/skills.md.
    skills_dir: Path = Path("skills")
    # Subagents (docs/subagents.md): how deep child runs may nest, and how many one parent
    # may start at once.
    subagent_max_depth: int = Field(default=2, ge=0, le=10)
    subagent_max_children: int = Field(default=4, ge=1, le=100)
    # Data lifecycle (docs/operations.md): installation defaults, which tenants may override.
    event_retention_days: int = Field(default=30, ge=1)
    span_retention_days: int = Field(default=14, ge=1)
    ledger_retention_days: int = Field(default=400, ge=1)
    audit_retention_days: int = Field(default=730, ge=1)
    # Daily partitions of the event log and the spans are created this many days ahead.
    partitions_ahead_days: int = Field(default=7, ge=1, le=90)
    # How long creating or dropping a day of the event log (or the spans) waits for the
    # table's lock before leaving it for the next pass: appends queue behind the wait.
    retention_lock_timeout_s: float = Field(default=2.0, gt=0, le=600)
    # How long an erasure asked to cancel its runs waits for them to end before answering 409.
    erasure_cancel_wait_s: float = Field(default=15.0, ge=0)
    # The LangGraph Agent Server API (docs/langgraph.md): the graphs of this `langgraph.json`
    # run beside agentrt's own agent; None loads none. Browser origins allowed by CORS.
    langgraph_config: Path | None = Path("langgraph.json")
    cors_origins: Annotated[list[str], NoDecode] = []

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    # LangGraph API threads (docs/langgraph.md): how long a thread marked `on_completion:
    # delete` outlives its run when no stream or wait delivered it, how often threads and
    # store items past their ttl are swept, and per tenant who sees a thread: `owner`
    # (default) or `tenant` (every user of the tenant, e.g. for a support team).
    langgraph_delete_grace_s: float = Field(default=60.0, ge=0)
    langgraph_sweep_s: float = Field(default=5.0, gt=0)
    langgraph_thread_visibility: dict[str, Literal["owner", "tenant"]] = Field(default_factory=dict)

    # Knowledge bases (docs/knowledge.md). Documents may be fetched by URL from these hosts
    # only (and their subdomains); empty: adding by URL is refused.
    knowledge_url_allowlist: list[str] = []
    knowledge_max_document_bytes: int = Field(default=50 * 1_048_576, ge=1024)
    # The chunks' vector index: `hnsw`, `ivf` (cells, server/knowledge/cells.py), `flat`
    # (exact scan), or `auto`: HNSW where pgvector can run it, else `ivf`.
    knowledge_index: Literal["auto", "hnsw", "ivf", "flat"] = "auto"
    knowledge_poll_seconds: float = Field(default=2.0, gt=0)
    knowledge_lease_seconds: float = Field(default=60.0, gt=0)
    knowledge_max_attempts: int = Field(default=5, ge=1)
    # Chunks embedded and stored per step of an ingestion (its progress unit).
    knowledge_batch_size: int = Field(default=64, ge=1, le=2048)
    # A cross-encoder `/rerank` endpoint; unset: no reranking.
    knowledge_rerank_url: str | None = None
