"""Which chat models runs use: ids of the form `provider:model`, validated at request time.

Providers: `demo` (offline keyword rules), `scripted:<name>` (turns from the scripts given
here or in `AGENTRT_SCRIPTED_MODELS_FILE`), `openai:<model>` (OpenAI or any OpenAI-compatible
server at `AGENTRT_OPENAI_BASE_URL`) and `litellm:<provider>/<model>` (what litellm reaches).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

from nodes.models.breaker import CircuitBreakers
from nodes.models.caller import ModelChoice, ModelPolicy, ResilientModelCaller
from nodes.models.demo import DemoChatModel
from nodes.models.litellm_chat import LiteLLMChatModel
from nodes.models.scripted import ScriptedChatModel, ScriptedTurn
from nodes.models.usage import Budget, RunTotals, UsageMeter
from server.errors import UnknownModelError
from server.settings import Settings
from server.usage.pricing import PriceBook, load_litellm

log = logging.getLogger(__name__)

PROVIDERS = ("demo", "scripted", "openai", "litellm")


class ModelRegistry:
    """Resolve model ids to chat models, fallbacks and a per-run model caller.

    Args:
        settings: Provider URLs and keys, fault policy, fallbacks, prices.
        scripts: Scripts for `scripted:<name>` (tests and benchmarks).
        breakers: The process's circuit breakers (one is made from settings by default).
    """

    def __init__(
        self,
        settings: Settings,
        scripts: Mapping[str, Sequence[ScriptedTurn]] | None = None,
        *,
        breakers: CircuitBreakers | None = None,
    ) -> None:
        self._settings = settings
        self._prefetch: asyncio.Future[Any] | None = None
        self._scripts: dict[str, list[ScriptedTurn]] = {}
        if settings.scripted_models_file:
            raw = json.loads(settings.scripted_models_file.read_text(encoding="utf-8"))
            for name, turns in raw.items():
                self._scripts[name] = [ScriptedTurn.model_validate(t) for t in turns]
        for name, script in (scripts or {}).items():
            self._scripts[name] = list(script)
        self.breakers = breakers or CircuitBreakers(
            settings.breaker_failure_threshold, settings.breaker_cooldown_s
        )
        self.pricer = PriceBook(settings)
        self._cache: dict[str, BaseChatModel] = {}
        for model_id, fallbacks in settings.model_fallbacks.items():
            for fallback in (model_id, *fallbacks) if model_id != "*" else fallbacks:
                self._check(fallback, where="AGENTRT_MODEL_FALLBACKS")
        for rule in settings.model_routes:
            self._check(rule.model, where="AGENTRT_MODEL_ROUTES")

    def _check(self, model_id: str, where: str) -> None:
        try:
            self.validate(model_id)
        except UnknownModelError as exc:
            raise ValueError(f"{where}: {exc}") from exc

    @property
    def needs_litellm(self) -> bool:
        """Say whether pricing or a provider will import litellm (slow: warm it up)."""
        return self._settings.litellm_enabled or self._openai_configured

    @property
    def _openai_configured(self) -> bool:
        s = self._settings
        return s.openai_api_key is not None or s.openai_base_url is not None

    def warm_up(self) -> None:
        """Import litellm now (seconds) rather than inside the first request or run."""
        if self.needs_litellm:
            load_litellm(self._settings)

    def prefetch_prices(self) -> None:
        """Start importing litellm in a thread, once: a graph's calls are priced from its map.

        Called as a run of a langgraph.json graph starts, so that its first priced call (which
        waits for the import in a thread, never on the event loop) seldom waits long.
        """
        if self._prefetch is None:
            self._prefetch = asyncio.ensure_future(asyncio.to_thread(load_litellm, self._settings))

    def validate(self, model_id: str | None) -> str:
        """Return the model id to use (the default when None), or raise UnknownModelError."""
        model_id = model_id or self._settings.default_model
        provider, _, name = model_id.partition(":")
        if provider == "demo" and not name:
            return model_id
        if provider == "scripted":
            if name in self._scripts:
                return model_id
            known = ", ".join(sorted(self._scripts)) or "none configured"
            raise UnknownModelError(f"no script named {name!r} (known scripts: {known})")
        if provider == "openai":
            return self._validate_openai(model_id, name)
        if provider == "litellm":
            return self._validate_litellm(model_id, name)
        raise UnknownModelError(
            f"unknown model {model_id!r}: use 'provider:model' with a provider among "
            f"{', '.join(PROVIDERS)} (e.g. 'openai:gpt-4o-mini'), or 'demo'"
        )

    def _validate_openai(self, model_id: str, name: str) -> str:
        if not self._openai_configured:
            raise UnknownModelError(
                f"provider 'openai' is not configured, so {model_id!r} cannot be used: set "
                "AGENTRT_OPENAI_API_KEY (and AGENTRT_OPENAI_BASE_URL for a compatible server)"
            )
        allowed = self._settings.openai_models
        if not name or (allowed and name not in allowed):
            raise UnknownModelError(
                f"unknown openai model {name!r}; allowed: {', '.join(allowed) or 'any name'}"
            )
        return model_id

    def _validate_litellm(self, model_id: str, name: str) -> str:
        if not self._settings.litellm_enabled:
            raise UnknownModelError(
                f"provider 'litellm' is not enabled, so {model_id!r} cannot be used: set "
                "AGENTRT_LITELLM_ENABLED=true and the provider's key"
            )
        allowed = self._settings.litellm_models
        if allowed and name not in allowed:
            raise UnknownModelError(
                f"unknown litellm model {name!r}; allowed: {', '.join(allowed)}"
            )
        litellm = load_litellm(self._settings)
        try:
            litellm.get_llm_provider(name)
        except Exception as exc:  # litellm raises BadRequestError for an unknown provider
            raise UnknownModelError(
                f"litellm cannot route {name!r}: use '<provider>/<model>', e.g. "
                "'anthropic/claude-sonnet-4-5'"
            ) from exc
        return model_id

    def create(self, model_id: str) -> BaseChatModel:
        """Return a chat model for a validated id (real providers are shared per id)."""
        provider, _, name = self.validate(model_id).partition(":")
        if provider == "scripted":
            return ScriptedChatModel(turns=self._scripts[name])
        if provider == "demo":
            return DemoChatModel(token_delay_s=self._settings.demo_token_delay_ms / 1000)
        if model_id not in self._cache:
            self._cache[model_id] = self._create_remote(provider, name)
        return self._cache[model_id]

    def _create_remote(self, provider: str, name: str) -> BaseChatModel:
        s = self._settings
        if provider == "openai":
            # Our caller owns retries and timeouts: the SDK's hidden retries are turned off.
            key = s.openai_api_key or SecretStr("unused-by-this-server")
            return ChatOpenAI(
                model=name,
                api_key=key,
                base_url=s.openai_base_url,
                max_retries=0,
                timeout=s.model_timeout_s,
                stream_usage=True,
            )
        return LiteLLMChatModel(
            model=name,
            api_base=s.litellm_api_base,
            api_key=s.litellm_api_key,
            timeout_s=s.model_timeout_s,
        )

    def fallbacks(self, model_id: str) -> list[str]:
        """Return the models to try, in order, after `model_id` fails."""
        table = self._settings.model_fallbacks
        chain = table.get(model_id, table.get("*", []))
        return [m for m in dict.fromkeys(chain) if m != model_id]

    def policy(self) -> ModelPolicy:
        """Return the fault policy from settings."""
        s = self._settings
        return ModelPolicy(
            max_attempts=s.model_max_attempts,
            backoff_base_s=s.model_backoff_base_s,
            backoff_max_s=s.model_backoff_max_s,
            retry_after_max_s=s.model_retry_after_max_s,
            timeout_s=s.model_timeout_s,
            ttft_timeout_s=s.model_ttft_timeout_s,
            retry_after_partial=s.model_retry_after_partial,
        )

    def choice(self, model_id: str) -> ModelChoice:
        """Return the model id with its provider, name and chat model."""
        provider, _, name = model_id.partition(":")
        return ModelChoice(model_id, provider, name or provider, self.create(model_id))

    def caller(
        self,
        model_id: str,
        *,
        budget: Budget | None = None,
        totals: Mapping[str, Any] | None = None,
    ) -> ResilientModelCaller:
        """Build the model caller of one run attempt, its meter seeded with stored `totals`."""
        choices = [self.choice(m) for m in (model_id, *self.fallbacks(model_id))]
        meter = UsageMeter(self.pricer, budget or Budget(), RunTotals.from_json(totals))
        return ResilientModelCaller(choices, self.policy(), self.breakers, meter)

    def describe(self) -> dict[str, Any]:
        """Say what is configured, for `GET /api/models` (no keys)."""
        s = self._settings
        return {
            "defaultModel": s.default_model,
            "providers": {
                "demo": True,
                "scripted": sorted(self._scripts),
                "openai": {
                    "configured": self._openai_configured,
                    "baseUrl": s.openai_base_url,
                    "models": s.openai_models,
                },
                "litellm": {
                    "enabled": s.litellm_enabled,
                    "apiBase": s.litellm_api_base,
                    "models": s.litellm_models,
                },
            },
            "fallbacks": s.model_fallbacks,
            "routes": [r.model_dump() for r in s.model_routes],
        }
