"""The offline demo model: keyword rules that call the built-in tools and stream an answer."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool

from nodes.models.scripted import ScriptedChatModel, ScriptedToolCall, ScriptedTurn

_EXPRESSION = re.compile(r"[-+(]*\d[\d\s.+\-*/^%()]*[+\-*/^%][\d\s.+\-*/^%()]*\d\)*")
_URL = re.compile(r"https?://[^\s\"'<>]+")
_TIME_WORDS = re.compile(r"\b(time|date|clock|today|now)\b", re.IGNORECASE)
_GREETING = (
    "Hello! I am agentrt's offline demo model, so I only follow a few simple rules. "
    "Ask me 'what time is it?', 'what is 12*(3+4)?' or 'fetch https://example.com' and you "
    "will see tool calls, events and streaming. Configure a real model to have a real "
    "conversation."
)


def plan_tool_calls(text: str, available: set[str]) -> list[ScriptedToolCall]:
    """Pick the tool calls a user message plainly asks for."""
    calls = []
    if "current_time" in available and _TIME_WORDS.search(text):
        calls.append(ScriptedToolCall(name="current_time", args={}))
    if "calculator" in available:
        calls.extend(
            ScriptedToolCall(name="calculator", args={"expression": m.group(0).strip()})
            for m in _EXPRESSION.finditer(text)
        )
    if "fetch_url" in available:
        calls.extend(
            ScriptedToolCall(name="fetch_url", args={"url": m.group(0).rstrip(".,;)")})
            for m in _URL.finditer(text)
        )
    return calls


def describe_result(message: ToolMessage, call: dict[str, Any] | None) -> str:
    """Say in one sentence what a tool returned."""
    content = str(message.content)
    if message.status == "error":
        return f"The tool {message.name} failed: {content}"
    if message.name == "current_time":
        return f"The current time is {content}."
    if message.name == "calculator" and call:
        return f"{call['args'].get('expression', '')} = {content}."
    if message.name == "fetch_url" and call:
        first = content.splitlines()[0] if content else ""
        return f"I fetched {call['args'].get('url')}: {first}, {len(content)} characters."
    return f"{message.name} returned: {content[:200]}"


class DemoChatModel(ScriptedChatModel):
    """Calls the available tools when asked plainly, then streams a summary of their results."""

    turns: list[ScriptedTurn] = []
    tool_names: frozenset[str] = frozenset()
    token_delay_s: float = 0.015
    name: str | None = "demo"

    @property
    def _llm_type(self) -> str:
        return "demo"

    def bind_tools(
        self, tools: Sequence[Any], **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Return a copy that knows the names of the tools it may call."""
        names = frozenset(convert_to_openai_tool(t)["function"]["name"] for t in tools)
        return self.model_copy(update={"tool_names": names})

    def _turn(self, messages: list[BaseMessage]) -> ScriptedTurn:
        results: list[ToolMessage] = []
        for message in reversed(messages):
            if not isinstance(message, ToolMessage):
                break
            results.insert(0, message)
        delay = self.token_delay_s
        if results:
            made: dict[str, dict[str, Any]] = {}
            for message in messages:
                if isinstance(message, AIMessage):
                    made.update({str(c["id"]): dict(c) for c in message.tool_calls})
            text = " ".join(describe_result(r, made.get(r.tool_call_id)) for r in results)
            return ScriptedTurn(text=text, chunk_chars=6, delay_s=delay)
        last = messages[-1] if messages else None
        user_text = str(last.content) if isinstance(last, HumanMessage) else ""
        calls = plan_tool_calls(user_text, set(self.tool_names))
        if calls:
            names = ", ".join(sorted({c.name for c in calls}))
            return ScriptedTurn(
                text=f"Let me use {names}.", tool_calls=calls, chunk_chars=6, delay_s=delay
            )
        return ScriptedTurn(text=_GREETING, chunk_chars=6, delay_s=delay)
