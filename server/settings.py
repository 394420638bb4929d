"""Settings: the only reader of the environment."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tools.config import ToolConfig


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
    tool_timeout_s: float = 30.0
    tool_max_output_chars: int = 16_000
    # Per-tenant tool policy and MCP servers (JSON; see docs/tools.md).
    tool_config: ToolConfig = Field(default_factory=ToolConfig)
    # Hosts that MCP servers configured through the API may be on; stdio servers can only be
    # configured here, by the operator. Empty: the API cannot add MCP servers.
    mcp_api_allowed_hosts: list[str] = []
    mcp_discovery_ttl_s: float = 300.0

    run_workers: bool = True
    worker_concurrency: int = 16
    lease_seconds: float = 30.0
    worker_poll_seconds: float = 5.0

    sse_heartbeat_s: float = 15.0
    sse_replay_page: int = 5000

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
