"""Which LangGraph API stream parts a run stores, from the parts `graph.astream` yields.

The API's modes map onto `astream`'s: `messages-tuple` is `astream`'s `messages` as it is
(events named `messages`); `messages` is derived from the same token stream, as LangGraph's
server does: `messages/metadata` when a message first appears, then the message so far as
`messages/partial` (a chunk) or `messages/complete`. `events` are LangChain's
`astream_events` (v2) of the run, but for the root graph's own stream events, which carry
the other modes' parts (as LangGraph's server streams them).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Sequence
from typing import Any

from langchain_core.messages import BaseMessage, BaseMessageChunk, message_chunk_to_message
from langgraph.pregel import Pregel

from server.langgraph_api.serde import to_json

# API mode -> the `astream` mode that produces it.
API_MODES = {
    "values": "values",
    "updates": "updates",
    "messages-tuple": "messages",
    "messages": "messages",
    "custom": "custom",
    "debug": "debug",
    "tasks": "tasks",
    "checkpoints": "checkpoints",
    "events": "events",
}
PARTIAL_MODES = ("messages/metadata", "messages/partial", "messages/complete")


def stored_modes(api_modes: Collection[str] | None) -> set[str] | None:
    """Return the stored part modes that serve the API modes asked for (None: all)."""
    wanted = [m for m in api_modes or () if m]  # the SDK sends `stream_mode=` for none
    if not wanted:
        return None
    found = {API_MODES[m] for m in wanted if m in API_MODES and m != "messages"}
    return found | (set(PARTIAL_MODES) if "messages" in wanted else set())


class StreamParts:
    """Turn `astream` parts into the `graph.chunk` payloads of the API modes asked for.

    Args:
        api_modes: The run's `stream_mode`.
        subgraphs: Keep the parts of subgraphs (`stream_subgraphs`).
    """

    def __init__(self, api_modes: Sequence[str], subgraphs: bool) -> None:
        kept = {m for m in api_modes if m in API_MODES and m not in ("messages", "events")}
        self.modes = {API_MODES[m] for m in kept}
        self.events = "events" in api_modes
        self.tuples = "messages-tuple" in api_modes
        self.partials = "messages" in api_modes
        self.subgraphs = subgraphs
        self._messages: dict[str, BaseMessage] = {}

    @property
    def astream_modes(self) -> set[str]:
        """The `astream` modes to ask for."""
        return self.modes | ({"messages"} if self.partials else set())

    def payloads(self, ns: Sequence[str], mode: str, chunk: Any) -> list[dict[str, Any]]:
        """Return the payloads to store for one part (none when nobody asked for it)."""
        if ns and not self.subgraphs:
            return []
        space = "|".join(ns)
        if mode == "events":
            return [{"mode": mode, "ns": space, "data": to_json(chunk)}] if self.events else []
        found = []
        if mode in self.modes and (mode != "messages" or self.tuples):
            found.append({"mode": mode, "ns": space, "data": to_json(chunk)})
        if mode == "messages" and self.partials:
            found += [{"mode": m, "ns": space, "data": d} for m, d in self._partial(chunk)]
        return found

    def _partial(self, chunk: Any) -> list[tuple[str, Any]]:
        message, metadata = chunk
        key = str(message.id)
        found: list[tuple[str, Any]] = []
        earlier = self._messages.get(key)
        if earlier is None:
            found.append(("messages/metadata", {key: {"metadata": to_json(metadata)}}))
            self._messages[key] = message
        elif isinstance(earlier, BaseMessageChunk) and isinstance(message, BaseMessageChunk):
            self._messages[key] = earlier + message
        else:
            self._messages[key] = message
        whole = message_chunk_to_message(self._messages[key])
        kind = "messages/partial" if isinstance(message, BaseMessageChunk) else "messages/complete"
        found.append((kind, [to_json(whole)]))
        return found


async def graph_events(
    graph: Pregel[Any], graph_input: Any, config: Any, **kwargs: Any
) -> AsyncIterator[tuple[tuple[str, ...], str, Any]]:
    """Yield what `graph.astream(..., subgraphs=True)` would, and each event as mode `events`.

    The graph runs under `astream_events` (v2): the root graph's `on_chain_stream` events are
    the parts `astream` would yield, every other event is yielded as a part of mode `events`
    (those tagged `langsmith:hidden` are left out).
    """
    root: str | None = None
    stream = graph.astream_events(graph_input, config, version="v2", subgraphs=True, **kwargs)
    async for event in stream:
        root = root or event["run_id"]  # the first event is the root graph's start
        if event["event"] == "on_chain_stream" and event["run_id"] == root:
            ns, mode, chunk = event["data"]["chunk"]
            yield ns, mode, chunk
        elif "langsmith:hidden" not in (event.get("tags") or ()):
            yield (), "events", event
