"""Settings: the only reader of the environment."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Runtime configuration, read once at start-up from `AGENTRT_*` variables and `.env`."""

    model_config = SettingsConfigDict(env_prefix="AGENTRT_", env_file=".env", extra="ignore")

    environment: Literal["local", "test", "production"] = "local"
    host: str = "127.0.0.1"
    port: int = 8000

    # Unprefixed on purpose: DATABASE_URL is what every hosting platform sets.
    database_url: str | None = Field(default=None, validation_alias="DATABASE_URL")
    data_dir: Path = Path(".agentrt")
    db_pool_min: int = 2
    db_pool_max: int = 20

    auth_enabled: bool = False
    default_tenant: str = "default"
    default_user: str = "local"

    default_model: str = "demo"
    demo_token_delay_ms: int = 15
    scripted_models_file: Path | None = None
    max_steps: int = 12
    max_message_chars: int = 100_000

    fetch_allowlist: list[str] = ["example.com", "httpbin.org"]
    # Extra tools to load, as "package.module:attribute" (a BaseTool or a list of them).
    tool_modules: list[str] = []
    tool_timeout_s: float = 30.0

    run_workers: bool = True
    worker_concurrency: int = 16
    lease_seconds: float = 10.0
    worker_poll_seconds: float = 2.0

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
    # Frames of each live run kept in memory for its streams (server/sse.py RunFeed).
    sse_feed_keep: int = 10_000

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
