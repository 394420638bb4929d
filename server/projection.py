"""Turn the LangGraph stream (messages, updates, custom) into run events (docs/events.md)."""

from __future__ import annotations

from typing import Any, Protocol

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langgraph.types import StreamMode

STREAM_MODES: list[StreamMode] = ["messages", "updates", "custom"]


class Emit(Protocol):
    def __call__(self, kind: str, data: dict[str, Any] | None = None) -> None: ...


class StreamProjector:
    """Project one run's stream parts into events, tracking the message items it opened.

    A message item is one assistant message: `message.item.created`, its `message.item.delta`s
    (the new text of each streamed chunk), then `message.item.completed` with the full text.
    An item from a model call that did not finish is closed: `interrupted` when the run fails
    or is cancelled, `superseded` when a custom event names it in `supersedes` (a model call
    retried or falling back after part of its answer streamed; docs/events.md).
    """

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._open: dict[str, list[str]] = {}

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
            data = dict(chunk)
            kind = data.pop("event")
            superseded = data.pop("supersedes", None)
            if superseded:
                self.supersede_items(superseded, kind)
            self._emit(kind, data)

    def replay_missing(
        self, messages: list[BaseMessage], since_id: str, recorded: set[str]
    ) -> None:
        """Emit the run's model answers that its checkpoints hold but its log lacks.

        A worker can die after a step's checkpoint was written but before that step's events
        were; the resumed attempt re-emits those answers (under new item ids, since the log
        may hold the old ones as superseded) so the run's output is complete.
        """
        seen_input = False
        for message in messages:
            if message.id == since_id:
                seen_input = True
            elif (
                seen_input
                and isinstance(message, AIMessage)
                and message.text
                and message.id not in recorded
            ):
                replayed = message.model_copy(update={"id": f"{message.id}~replayed"})
                self._complete(replayed, "call_model")

    def close_open_items(self, status: str, reason: str) -> None:
        """Close every item still streaming with `status`.

        `superseded`: a retry replaces the text and clients drop it. `interrupted`: the run
        stopped; the text stays as it was streamed.
        """
        self.close_items(list(self._open), status, reason)

    def supersede_items(self, item_ids: list[str], reason: str) -> None:
        """Close the named items that are still streaming as `superseded`."""
        self.close_items(item_ids, "superseded", reason)

    def close_items(self, item_ids: list[str], status: str, reason: str) -> None:
        """Close the named items that are still streaming with `status`."""
        for item_id in item_ids:
            parts = self._open.pop(item_id, None)
            if parts is None:
                continue
            self._emit(
                "message.item.completed",
                {"itemId": item_id, "status": status, "text": "".join(parts), "reason": reason},
            )

    def _delta(self, message: AIMessageChunk, node: str | None) -> None:
        text = message.text
        if not text or not message.id:
            return
        if message.id not in self._open:
            self._open[message.id] = []
            self._emit(
                "message.item.created", {"itemId": message.id, "role": "assistant", "node": node}
            )
        self._open[message.id].append(text)
        self._emit("message.item.delta", {"itemId": message.id, "delta": text})

    def _complete(self, message: BaseMessage, node: str) -> None:
        item_id = message.id or ""
        parts = self._open.pop(item_id, None)
        if parts is None:
            if not message.text:
                return
            # Not streamed (the model answered in one piece): still one delta, so that
            # clients that rebuild text from deltas see all of it.
            self._emit(
                "message.item.created", {"itemId": item_id, "role": "assistant", "node": node}
            )
            self._emit("message.item.delta", {"itemId": item_id, "delta": message.text})
            parts = [message.text]
        tool_calls = getattr(message, "tool_calls", [])
        data: dict[str, Any] = {
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
        self._emit("message.item.completed", data)
