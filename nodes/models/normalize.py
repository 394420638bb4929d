"""The provider-neutral shape of a model answer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.messages.tool import ToolCall

from nodes.models.usage import TokenUsage

# Provider metadata worth keeping; the rest of `response_metadata` varies by provider.
_METADATA_KEYS = ("model_name", "model", "system_fingerprint", "service_tier", "id")


@dataclass(frozen=True)
class ModelResult:
    """One answer, whatever the provider: text, tool calls, finish reason, usage, reasoning."""

    text: str
    tool_calls: list[ToolCall]
    finish_reason: str | None
    usage: TokenUsage
    reasoning: str | None = None
    provider_metadata: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """Return what is kept on the message (`response_metadata["agentrt"]`)."""
        out: dict[str, Any] = {"finishReason": self.finish_reason}
        if self.reasoning:
            out["reasoning"] = self.reasoning
        if self.provider_metadata:
            out["providerMetadata"] = self.provider_metadata
        return out


def _reasoning(message: AIMessage) -> str | None:
    """Collect a reasoning summary: `reasoning_content` (litellm, DeepSeek, vLLM) or blocks."""
    kwargs = message.additional_kwargs
    for key in ("reasoning_content", "reasoning"):
        value = kwargs.get(key)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, dict):
            parts = [s.get("text", "") for s in value.get("summary", []) if isinstance(s, dict)]
            if any(parts):
                return "\n".join(p for p in parts if p)
    if isinstance(message.content, list):
        texts = []
        for block in message.content:
            if isinstance(block, dict) and block.get("type") in ("reasoning", "thinking"):
                text = block.get("reasoning") or block.get("thinking") or block.get("text")
                if not text and isinstance(block.get("summary"), list):
                    text = "\n".join(s.get("text", "") for s in block["summary"])
                if text:
                    texts.append(str(text))
        if texts:
            return "\n".join(texts)
    return None


def normalize(message: AIMessage) -> ModelResult:
    """Read a langchain-core `AIMessage` from any adapter into a `ModelResult`."""
    meta = message.response_metadata
    finish = meta.get("finish_reason") or meta.get("stop_reason")
    return ModelResult(
        text=message.text,
        tool_calls=list(message.tool_calls),
        finish_reason=str(finish) if finish is not None else None,
        usage=TokenUsage.from_message(message),
        reasoning=_reasoning(message),
        provider_metadata={k: meta[k] for k in _METADATA_KEYS if meta.get(k) is not None},
    )
