"""A small langchain-core chat model over `litellm.acompletion(stream=True)`.

litellm speaks the OpenAI chat format to ~100 providers (Anthropic, Gemini, Bedrock, Qwen,
DeepSeek...). This adapter streams its chunks as `AIMessageChunk`s with tool-call chunks,
`usage_metadata` (cached and reasoning tokens included), `reasoning_content` and the finish
reason, and lets litellm's exceptions (subclasses of the `openai` SDK's) through unchanged so
nodes/models/faults.py classifies them. Retries are ours: litellm's own are turned off.
See docs/decisions/0102-litellm-adapter.md for why this is not `langchain-litellm`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.chat_models import agenerate_from_stream, generate_from_stream
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.ai import InputTokenDetails, OutputTokenDetails, UsageMetadata
from langchain_core.messages.tool import ToolCallChunk
from langchain_core.messages.utils import convert_to_openai_messages
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field, SecretStr


def _get(obj: Any, key: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, key, None)


def usage_metadata(usage: Any) -> UsageMetadata | None:
    """Convert an OpenAI-style `usage` block (object or dict) to langchain-core's form."""
    if usage is None:
        return None
    prompt = int(_get(usage, "prompt_tokens") or 0)
    completion = int(_get(usage, "completion_tokens") or 0)
    cached = int(_get(_get(usage, "prompt_tokens_details"), "cached_tokens") or 0)
    reasoning = int(_get(_get(usage, "completion_tokens_details"), "reasoning_tokens") or 0)
    meta = UsageMetadata(
        input_tokens=prompt, output_tokens=completion, total_tokens=prompt + completion
    )
    if cached:
        meta["input_token_details"] = InputTokenDetails(cache_read=cached)
    if reasoning:
        meta["output_token_details"] = OutputTokenDetails(reasoning=reasoning)
    return meta


def chunk_to_message(chunk: Any) -> AIMessageChunk:
    """Convert one litellm stream chunk (OpenAI `chat.completion.chunk` shape)."""
    choices = _get(chunk, "choices") or []
    choice = choices[0] if choices else None
    delta = _get(choice, "delta")
    tool_chunks: list[ToolCallChunk] = []
    for call in _get(delta, "tool_calls") or []:
        function = _get(call, "function")
        tool_chunks.append(
            ToolCallChunk(
                name=_get(function, "name"),
                args=_get(function, "arguments"),
                id=_get(call, "id"),
                index=_get(call, "index"),
                type="tool_call_chunk",
            )
        )
    additional: dict[str, Any] = {}
    reasoning = _get(delta, "reasoning_content")
    if reasoning:
        additional["reasoning_content"] = reasoning
    metadata: dict[str, Any] = {}
    finish = _get(choice, "finish_reason")
    if finish:
        # Only on the last chunk: langchain-core concatenates string metadata when merging.
        metadata = {"finish_reason": finish, "model_name": _get(chunk, "model")}
    return AIMessageChunk(
        content=_get(delta, "content") or "",
        tool_call_chunks=tool_chunks,
        additional_kwargs=additional,
        response_metadata=metadata,
        usage_metadata=usage_metadata(_get(chunk, "usage")),
    )


class LiteLLMChatModel(BaseChatModel):
    """Chat with any model litellm reaches, e.g. `anthropic/claude-sonnet-4-5`.

    Attributes:
        model: litellm's model string (`<provider>/<model>`).
        api_base: Override of the provider's URL (a proxy, a self-hosted server).
        api_key: Key for the provider; litellm reads its own variables when None.
        timeout_s: The HTTP timeout litellm applies (ours is enforced by the caller too).
        params: Extra completion parameters (temperature, max_tokens...).
    """

    model: str
    api_base: str | None = None
    api_key: SecretStr | None = None
    timeout_s: float | None = None
    params: dict[str, Any] = Field(default_factory=dict)

    @property
    def _llm_type(self) -> str:
        return "litellm"

    def bind_tools(
        self, tools: Sequence[Any], *, tool_choice: str | None = None, **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools in the OpenAI format litellm translates for every provider."""
        formatted = [convert_to_openai_tool(t) for t in tools]
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=formatted, **kwargs)

    def _request(self, messages: list[BaseMessage], stop: list[str] | None, **kwargs: Any) -> Any:
        request: dict[str, Any] = {
            "model": self.model,
            "messages": convert_to_openai_messages(messages),
            "stream": True,
            "stream_options": {"include_usage": True},
            "num_retries": 0,
            "max_retries": 0,
            **self.params,
            **kwargs,
        }
        if stop:
            request["stop"] = stop
        if self.api_base:
            request["api_base"] = self.api_base
        if self.api_key is not None:
            request["api_key"] = self.api_key.get_secret_value()
        if self.timeout_s is not None:
            request["timeout"] = self.timeout_s
        return request

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        import litellm

        response = await litellm.acompletion(**self._request(messages, stop, **kwargs))
        async for chunk in response:
            yield ChatGenerationChunk(message=chunk_to_message(chunk))

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        import litellm

        for chunk in litellm.completion(**self._request(messages, stop, **kwargs)):
            yield ChatGenerationChunk(message=chunk_to_message(chunk))

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return generate_from_stream(self._stream(messages, stop, run_manager, **kwargs))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return await agenerate_from_stream(self._astream(messages, stop, run_manager, **kwargs))
