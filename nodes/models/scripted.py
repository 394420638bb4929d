"""A scripted chat model: replays a fixed list of turns, for tests and benchmarks."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from pydantic import BaseModel, Field

FRESH_ID = "fresh"


def _call_id(scripted: str | None, position: int, index: int) -> str:
    if scripted == FRESH_ID:
        return f"call_{uuid.uuid4().hex[:12]}"
    return scripted or f"call_{position}_{index}"


class ScriptedToolCall(BaseModel):
    """A tool call the script makes.

    `id` is the call's id; None derives one from the turn's position (the same on a re-run),
    and `FRESH_ID` makes a new one on every model call, as real providers do.
    """

    name: str
    args: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None


class ScriptedTurn(BaseModel):
    """One model answer: text streamed in `chunks` pieces, then optional tool calls.

    `error` raises instead of answering (after `fail_after_chunks` chunks were streamed).
    """

    text: str = ""
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    chunk_chars: int = 4
    delay_s: float = 0.0
    error: str | None = None
    fail_after_chunks: int = 0
    usage: dict[str, int] | None = None


def turn_index(messages: Sequence[BaseMessage]) -> int:
    """Count the model turns since the last user message: the script position to answer with.

    Derived from the input alone, so a replay after a crash gets the same answer again.
    """
    count = 0
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            break
        if isinstance(message, AIMessage):
            count += 1
    return count


class ScriptedChatModel(BaseChatModel):
    """Answers with `turns[i]`, where i is the number of model turns since the user spoke."""

    turns: list[ScriptedTurn]
    name: str | None = "scripted"

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(
        self, tools: Sequence[Any], **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Return the model itself: scripted answers name their tools already."""
        return self

    def _turn(self, messages: list[BaseMessage]) -> ScriptedTurn:
        index = turn_index(messages)
        if index >= len(self.turns):
            return ScriptedTurn(text=f"[script exhausted after {len(self.turns)} turns]")
        return self.turns[index]

    def _chunks(self, turn: ScriptedTurn, position: int) -> Iterator[ChatGenerationChunk]:
        text = turn.text
        size = max(1, turn.chunk_chars)
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        for n, piece in enumerate(pieces):
            if turn.error and n == turn.fail_after_chunks:
                raise RuntimeError(turn.error)
            yield ChatGenerationChunk(message=AIMessageChunk(content=piece))
        if turn.error:
            raise RuntimeError(turn.error)
        usage = turn.usage or {
            "input_tokens": 10,
            "output_tokens": max(1, len(pieces)),
            "total_tokens": 10 + max(1, len(pieces)),
        }
        final = AIMessageChunk(
            content="",
            tool_call_chunks=[
                {
                    "name": call.name,
                    "args": json.dumps(call.args),
                    "id": _call_id(call.id, position, index),
                    "index": index,
                    "type": "tool_call_chunk",
                }
                for index, call in enumerate(turn.tool_calls)
            ],
            usage_metadata=UsageMetadata(**usage),  # type: ignore[typeddict-item]
            response_metadata={"finish_reason": "tool_calls" if turn.tool_calls else "stop"},
            chunk_position="last",
        )
        yield ChatGenerationChunk(message=final)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        merged: ChatGenerationChunk | None = None
        for chunk in self._chunks(self._turn(messages), turn_index(messages)):
            merged = chunk if merged is None else merged + chunk
        assert merged is not None
        return ChatResult(generations=[ChatGeneration(message=merged.message)])

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        turn = self._turn(messages)
        for chunk in self._chunks(turn, turn_index(messages)):
            if turn.delay_s:
                await asyncio.sleep(turn.delay_s)
            if run_manager and isinstance(chunk.message.content, str) and chunk.message.content:
                await run_manager.on_llm_new_token(chunk.message.content, chunk=chunk)
            yield chunk
