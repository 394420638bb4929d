"""Turn the LangGraph stream (messages, updates, custom) into run events (docs/events.md)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langgraph.types import StreamMode

from graphs.events import EventType, MessageItemCompleted

log = logging.getLogger(__name__)

STREAM_MODES: list[StreamMode] = ["messages", "updates", "custom"]
REPLAYED = "~replayed"  # suffix of the item id of an answer re-emitted from a checkpoint
ClosedStatus = Literal["superseded", "interrupted"]
_TYPES = frozenset(EventType)


class EventSink(Protocol):
    """Where projected events go: the run's `EventWriter.emit`."""

    def __call__(self, kind: EventType, data: Mapping[str, Any] | None = None) -> None:
        """Queue event `kind` with payload `data`."""


class StreamProjector:
    """Project one run's stream parts into events, tracking the message items it opened.

    A message item is one assistant message: `message.item.created`, its `message.item.delta`s
    (the new text of each streamed chunk), then `message.item.completed` with the full text.
    An item from a model call that did not finish is closed: `interrupted` when the run fails
    or is cancelled, `superseded` when a custom event names it in `supersedes` (a model call
    retried or falling back after part of its answer streamed; docs/events.md).
    """

    def __init__(self, emit: EventSink, logged: dict[str, str] | None = None) -> None:
        self._emit = emit
        self._open: dict[str, list[str]] = {}
        # Items earlier attempts logged, by status: an answer LangGraph re-outputs on resume
        # (a finished task's saved writes) is not emitted twice, nor under a closed item's id.
        self._logged = dict(logged or {})

    def handle(self, mode: str, chunk: Any) -> None:
        """Project one `(mode, chunk)` part of `graph.astream(stream_mode=STREAM_MODES)`."""
        if mode == "messages":
            message, metadata = chunk
            if isinstance(message, AIMessageChunk):
                self._delta(message, metadata.get("langgraph_node"))
        elif mode == "updates":
            for node, update in chunk.items():
                if isinstance(update, dict):
                    for message in update.get("messages", []):
                        if isinstance(message, AIMessage):
                            self._complete(message, node)
        elif mode == "custom" and isinstance(chunk, dict) and "event" in chunk:
            self._custom(dict(chunk))

    def _custom(self, data: dict[str, Any]) -> None:
        kind = data.pop("event")
        if kind not in _TYPES:
            # Other code in a node may write to the stream too; only our vocabulary is stored.
            log.warning("not stored: custom stream event of unknown type %r", kind)
            return
        superseded = data.pop("supersedes", None)
        if superseded:
            self.supersede_items(superseded, kind)
        self._emit(EventType(kind), data)

    def replay_missing(
        self, messages: list[BaseMessage], since_id: str, recorded: set[str]
    ) -> None:
        """Emit the run's model answers that its checkpoints hold but its log lacks.

        A worker can die after a step's checkpoint was written but before that step's events
        were; the resumed attempt re-emits those answers (under new item ids, since the log
        may hold the old ones as superseded) so the run's output is complete. An answer the
        log already holds under either id is not emitted again.
        """
        for message in _answers_since(messages, since_id):
            if message.text and not {message.id, replayed_id(message.id)} & recorded:
                replayed = message.model_copy(update={"id": replayed_id(message.id)})
                self._complete(replayed, "call_model")

    def supersede_unsaved(
        self, messages: list[BaseMessage], since_id: str, recorded: set[str]
    ) -> None:
        """Supersede logged answers that the run's last checkpoint does not hold.

        An attempt that stopped before its model turn was checkpointed logged an answer the
        next attempt asks for again; without this, the run's output would hold both.
        """
        saved = set()
        for message in _answers_since(messages, since_id):
            saved |= {message.id, replayed_id(message.id)}
        lost = sorted(recorded - saved)
        for item_id in lost:
            self._logged[item_id] = "superseded"
            self._emit(
                EventType.MESSAGE_ITEM_COMPLETED,
                {"itemId": item_id, "status": "superseded", "reason": "attempt not checkpointed"},
            )

    def close_open_items(self, status: ClosedStatus, reason: str) -> None:
        """Close every item still streaming with `status`.

        `superseded`: a retry replaces the text and clients drop it. `interrupted`: the run
        stopped; the text stays as it was streamed.
        """
        self.close_items(list(self._open), status, reason)

    def supersede_items(self, item_ids: list[str], reason: str) -> None:
        """Close the named items that are still streaming as `superseded`."""
        self.close_items(item_ids, "superseded", reason)

    def close_items(self, item_ids: list[str], status: ClosedStatus, reason: str) -> None:
        """Close the named items that are still streaming with `status`."""
        for item_id in item_ids:
            parts = self._open.pop(item_id, None)
            if parts is None:
                continue
            closed: MessageItemCompleted = {
                "itemId": item_id,
                "status": status,
                "text": "".join(parts),
                "reason": reason,
            }
            self._emit(EventType.MESSAGE_ITEM_COMPLETED, closed)

    def _delta(self, message: AIMessageChunk, node: str | None) -> None:
        text = message.text
        if not text or not message.id:
            return
        if message.id not in self._open:
            self._open[message.id] = []
            self._created(message.id, node)
        self._open[message.id].append(text)
        self._emit(EventType.MESSAGE_ITEM_DELTA, {"itemId": message.id, "delta": text})

    def _created(self, item_id: str, node: str | None) -> None:
        self._emit(
            EventType.MESSAGE_ITEM_CREATED, {"itemId": item_id, "role": "assistant", "node": node}
        )

    def _complete(self, message: BaseMessage, node: str) -> None:
        item_id = message.id or ""
        parts = self._open.pop(item_id, None)
        if parts is None:
            if not message.text:
                return
            if "completed" in (self._logged.get(item_id), self._logged.get(replayed_id(item_id))):
                return  # an earlier attempt logged this answer
            if item_id in self._logged:
                item_id = replayed_id(item_id)  # the log closed this id; the answer needs a new one
            self._logged[item_id] = "completed"
            # Not streamed (the model answered in one piece): still one delta, so that
            # clients that rebuild text from deltas see all of it.
            self._created(item_id, node)
            self._emit(EventType.MESSAGE_ITEM_DELTA, {"itemId": item_id, "delta": message.text})
            parts = [message.text]
        tool_calls = getattr(message, "tool_calls", [])
        data: MessageItemCompleted = {
            "itemId": item_id,
            "status": "completed",
            "text": "".join(parts),
            "toolCalls": [{"id": c["id"], "name": c["name"]} for c in tool_calls],
        }
        served = message.response_metadata.get("agentrt")
        if isinstance(served, dict):
            # Which model answered (after retries or fallbacks) and how it finished.
            data["model"] = served.get("modelId")
            data["finishReason"] = served.get("finishReason")
            if served.get("reasoning"):
                data["reasoning"] = served["reasoning"]
        self._emit(EventType.MESSAGE_ITEM_COMPLETED, data)


def replayed_id(message_id: str | None) -> str:
    """Return the item id under which a checkpointed but unlogged answer is re-emitted."""
    base = (message_id or "").removesuffix(REPLAYED)
    return f"{base}{REPLAYED}"


def _answers_since(messages: list[BaseMessage], since_id: str) -> list[AIMessage]:
    """Return the model answers after the message `since_id` (the run's input)."""
    ids = [m.id for m in messages]
    if since_id not in ids:
        return []
    start = ids.index(since_id) + 1
    return [m for m in messages[start:] if isinstance(m, AIMessage)]
