"""Which chat model a run uses: ids of the form `provider:model`, validated at request time."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from langchain_core.language_models import BaseChatModel

from nodes.models.demo import DemoChatModel
from nodes.models.scripted import ScriptedChatModel, ScriptedTurn
from server.settings import Settings


class UnknownModelError(ValueError):
    """The model id names no provider or model this server knows."""


class ModelRegistry:
    """Resolve model ids to chat models.

    Providers: `demo` (offline keyword rules) and `scripted:<name>` (turns from the scripts
    given here or in `AGENTRT_SCRIPTED_MODELS_FILE`, a JSON object of name -> list of turns).
    """

    def __init__(
        self, settings: Settings, scripts: Mapping[str, Sequence[ScriptedTurn]] | None = None
    ) -> None:
        self._settings = settings
        self._scripts: dict[str, list[ScriptedTurn]] = {}
        if settings.scripted_models_file:
            raw = json.loads(settings.scripted_models_file.read_text(encoding="utf-8"))
            for name, turns in raw.items():
                self._scripts[name] = [ScriptedTurn.model_validate(t) for t in turns]
        for name, script in (scripts or {}).items():
            self._scripts[name] = list(script)

    def add_script(self, name: str, turns: Sequence[ScriptedTurn]) -> None:
        """Register (or replace) the script behind `scripted:<name>`."""
        self._scripts[name] = list(turns)

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
        raise UnknownModelError(
            f"unknown model {model_id!r}: use 'demo' or 'scripted:<name>' (real providers "
            "are configured as 'provider:model')"
        )

    def create(self, model_id: str) -> BaseChatModel:
        """Return a chat model for a validated id."""
        provider, _, name = self.validate(model_id).partition(":")
        if provider == "scripted":
            return ScriptedChatModel(turns=self._scripts[name])
        return DemoChatModel(token_delay_s=self._settings.demo_token_delay_ms / 1000)
