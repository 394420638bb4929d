"""Spans for graph nodes, model calls and tool calls, from LangChain's callbacks."""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage, message_to_dict
from langchain_core.outputs import LLMResult
from langgraph.constants import TAG_HIDDEN
from langgraph.errors import GraphBubbleUp

from server import jsontext
from server.observability.tracing import RunInfo, RunSpan, Tracing, cut
from tools.validation import redact

# Redacted field names that JSON writes as they are: a key's text in a dump is the key.
_PLAIN_NAME = re.compile(r"[a-z0-9_.-]+")


@functools.lru_cache(maxsize=16)
def _key_pattern(fields: tuple[str, ...]) -> re.Pattern[str] | None:
    """A pattern finding any of `fields` as an object's key in lowered JSON text.

    It also finds them in JSON text held in strings, at any depth (their quotes escaped).
    None if a field is not plain: then every payload is walked.
    """
    names = [f.lower() for f in fields]
    if not all(_PLAIN_NAME.fullmatch(n) for n in names):
        return None
    return re.compile("(?:" + "|".join(map(re.escape, names)) + r')\\*"\s*:')


def _plain(value: Any) -> Any:
    return dict(value) if isinstance(value, Mapping) else str(value)


def redacted_json(data: Any, fields: Sequence[str]) -> str:
    """`data` as JSON text, the values of `fields` redacted as `tools.validation.redact` does.

    A model call's input is the whole conversation: walking it for fields that are rarely
    there cost more than everything else a long run's trace does. So the dump comes first,
    and the walk only when one of the fields can be a key in it. (Without the walk, JSON text
    in a string that mentions a field's name without holding it as a key keeps its spacing.)
    """
    text = jsontext.dumps(data, default=_plain)
    if not fields:
        return text
    pattern = _key_pattern(tuple(fields))
    if pattern is None or pattern.search(text.lower()):
        text = jsontext.dumps(redact(data, fields, json_text=True), default=_plain)
    return text


class TraceCallbackHandler(BaseCallbackHandler):
    """Spans for graph nodes, model calls and tool calls, from LangChain's callbacks."""

    run_inline = True
    raise_error = False

    def __init__(self, tracing: Tracing, info: RunInfo, parent: RunSpan) -> None:
        self._tracing = tracing
        self._info = info
        self._root = parent
        self._common = info.attributes()
        self._spans: dict[UUID, RunSpan] = {}
        self._own: set[UUID] = set()
        self._started: dict[UUID, float] = {}
        self._first_token: dict[UUID, float] = {}
        self._model: dict[UUID, tuple[str, str]] = {}
        self._tool: dict[UUID, str] = {}

    # -- helpers --------------------------------------------------------------------------

    def _parent(self, parent_run_id: UUID | None) -> RunSpan:
        return self._spans.get(parent_run_id, self._root) if parent_run_id else self._root

    def _open(
        self,
        run_id: UUID,
        parent_run_id: UUID | None,
        name: str,
        kind: str,
        attributes: dict[str, Any],
    ) -> RunSpan:
        span = self._tracing.span(
            name,
            self._parent(parent_run_id),
            {**self._common, "agentrt.kind": kind, **attributes},
        )
        self._spans[run_id] = span
        self._own.add(run_id)
        self._started[run_id] = time.perf_counter()
        return span

    def _close(self, run_id: UUID, error: BaseException | None = None) -> RunSpan | None:
        span = self._spans.pop(run_id, None)
        if run_id not in self._own or span is None:
            return None
        self._own.discard(run_id)
        if error is not None:
            if isinstance(error, GraphBubbleUp):
                span.add_event("interrupted", {"reason": type(error).__name__})
            else:
                span.record_exception(error)
                span.set_error(f"{type(error).__name__}: {error}")
        span.end()
        return span

    def _payload(self, span: RunSpan, kind: str, data: Any) -> None:
        text = redacted_json(data, self._tracing.settings.redact_fields)
        shown, truncated = cut(text, self._tracing.settings.trace_payload_chars)
        span.set_attribute(f"agentrt.{kind}", shown)
        if truncated:
            # Only a cut attribute needs its full copy kept apart; an uncut one is the payload.
            span.set_attribute(f"agentrt.{kind}_truncated", True)
            self._tracing.sink.add_payload(span.trace_id, span.span_id, kind, text)

    # -- graph nodes ----------------------------------------------------------------------

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Open a span for a graph node (other chains are not traced)."""
        name = kwargs.get("name") or ""
        node = (metadata or {}).get("langgraph_node")
        if parent_run_id is None or TAG_HIDDEN in (tags or []) or name != node:
            # The graph itself, routers and LangGraph internals: children attach to our parent.
            self._spans[run_id] = self._parent(parent_run_id)
            return
        self._open(
            run_id,
            parent_run_id,
            f"node {name}",
            "node",
            {"agentrt.node": name, "agentrt.step": (metadata or {}).get("langgraph_step")},
        )

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """End the node's span."""
        self._close(run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """End the node's span as failed."""
        self._close(run_id, error)

    # -- model calls ----------------------------------------------------------------------

    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Open a span for a model call."""
        meta = metadata or {}
        params = kwargs.get("invocation_params") or {}
        provider = str(meta.get("ls_provider") or params.get("_type") or "unknown")
        model = str(
            meta.get("ls_model_name") or params.get("model") or params.get("model_name") or provider
        )
        self._model[run_id] = (provider, model)
        span = self._open(
            run_id,
            parent_run_id,
            "model.call",
            "model",
            {
                "gen_ai.system": provider,
                "gen_ai.request.model": model,
                "agentrt.messages": sum(len(batch) for batch in messages),
            },
        )
        step = meta.get("agentrt_step")
        if step is not None:  # link the manifest of what this call was sent (docs/context.md)
            span.set_attributes(
                {
                    "agentrt.step": int(step),
                    "agentrt.purpose": str(meta.get("agentrt_purpose", "answer")),
                    "agentrt.context_url": f"/api/runs/{self._info.run_id}/context"
                    f"?step={int(step)}&attempt={self._info.attempt}",
                }
            )
        self._payload(span, "input", [[message_to_dict(m) for m in batch] for batch in messages])

    def on_llm_new_token(self, token: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Note when the model call's first token arrived."""
        if run_id not in self._first_token and run_id in self._started:
            self._first_token[run_id] = time.perf_counter()

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        """End the model call's span with its answer and token usage."""
        span = self._spans.get(run_id)
        provider, model = self._model.pop(run_id, ("unknown", "unknown"))
        started = self._started.pop(run_id, time.perf_counter())
        first = self._first_token.pop(run_id, None)
        if span is not None and run_id in self._own:
            generation = response.generations[0][0] if response.generations else None
            message = getattr(generation, "message", None)
            usage = getattr(message, "usage_metadata", None) or {}
            meta = getattr(message, "response_metadata", None) or {}
            attrs: dict[str, Any] = {
                "gen_ai.usage.input_tokens": usage.get("input_tokens", 0),
                "gen_ai.usage.output_tokens": usage.get("output_tokens", 0),
                "gen_ai.response.finish_reasons": [str(meta.get("finish_reason", ""))],
                "agentrt.tool_calls": len(getattr(message, "tool_calls", []) or []),
            }
            if first is not None:
                attrs["agentrt.ttft_ms"] = round((first - started) * 1000, 3)
            span.set_attributes(attrs)
            if message is not None:
                self._payload(span, "output", message_to_dict(message))
            self._tracing.metrics.observe_model_call(
                provider,
                model,
                time.perf_counter() - started,
                None if first is None else first - started,
                usage,
                "ok",
            )
        self._close(run_id)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """End the model call's span as failed."""
        provider, model = self._model.pop(run_id, ("unknown", "unknown"))
        started = self._started.pop(run_id, time.perf_counter())
        self._first_token.pop(run_id, None)
        self._tracing.metrics.observe_model_call(
            provider, model, time.perf_counter() - started, None, {}, "error"
        )
        self._close(run_id, error)

    # -- tool calls -----------------------------------------------------------------------

    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Open a span for a tool call."""
        name = str((serialized or {}).get("name") or kwargs.get("name") or "tool")
        self._tool[run_id] = name
        args = redact(
            inputs if inputs is not None else input_str,
            self._tracing.settings.redact_fields,
            json_text=True,
        )
        span = self._open(
            run_id, parent_run_id, f"tool {name}", "tool", {"agentrt.tool.name": name}
        )
        self._payload(span, "input", args)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """End the tool's span with its result."""
        span = self._spans.get(run_id)
        name = self._tool.pop(run_id, "tool")
        started = self._started.pop(run_id, time.perf_counter())
        if span is not None and run_id in self._own:
            content = getattr(output, "content", output)
            self._payload(span, "output", content)
            span.set_attribute("agentrt.tool.outcome", "ok")
        self._tracing.metrics.observe_tool_call(name, time.perf_counter() - started, "ok")
        self._close(run_id)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """End the tool's span as failed."""
        span = self._spans.get(run_id)
        name = self._tool.pop(run_id, "tool")
        started = self._started.pop(run_id, time.perf_counter())
        if span is not None:
            span.set_attribute("agentrt.tool.outcome", "error")
        self._tracing.metrics.observe_tool_call(name, time.perf_counter() - started, "error")
        self._close(run_id, error)

    def close_all(self, reason: str) -> None:
        """End spans whose work never reported back (cancelled, timed out), marked as errors."""
        for run_id in list(self._own):
            span = self._spans.get(run_id)
            if span is not None:
                span.set_error(reason)
            self._close(run_id)
