"""What an API process remembers between posts, so that a message is stored in one round trip.

Posting a message needs the conversation's agent and model (set when the conversation was
created, never changed after) and the latest version of the agent's profile. Read, they
cost a round trip before the inserts can go; remembered, the inserts go at once with a
check that what was remembered still holds (`accept_expected`, docs/decisions/2017). What
is remembered is only ever a guess: the check decides, and a refused guess is forgotten.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from server.agents.store import AgentVersion

K = TypeVar("K")
V = TypeVar("V")


class _Recent(Generic[K, V]):
    """A mapping that keeps its `size` most recently used entries."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        found = self._items.get(key)
        if found is not None:
            self._items.move_to_end(key)
        return found

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self._size:
            self._items.popitem(last=False)

    def pop(self, key: K) -> None:
        self._items.pop(key, None)

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True)
class KnownConversation:
    """A conversation's profile reference and model, as it was created."""

    agent: str | None
    model: str | None


class PostMemo:
    """Conversations met and profiles' latest versions, by tenant, the most recent kept.

    Args:
        conversations: How many conversations to keep.
        agents: How many profiles to keep.
    """

    def __init__(self, conversations: int = 10_000, agents: int = 1_000) -> None:
        self._conversations: _Recent[tuple[str, str], KnownConversation] = _Recent(conversations)
        self._agents: _Recent[tuple[str, str], AgentVersion] = _Recent(agents)

    def conversation(self, tenant_id: str, conversation_id: str) -> KnownConversation | None:
        """What is remembered of a conversation, if anything."""
        return self._conversations.get((tenant_id, conversation_id))

    def agent(self, tenant_id: str, name: str) -> AgentVersion | None:
        """The latest version of a profile, when last read, if remembered."""
        return self._agents.get((tenant_id, name))

    def met_conversation(self, tenant_id: str, row: dict[str, Any]) -> None:
        """Remember a conversation's row as created or read."""
        self._conversations.put(
            (tenant_id, row["id"]), KnownConversation(row["agent"], row["model"])
        )

    def met_agent(self, tenant_id: str, agent: AgentVersion) -> None:
        """Remember the latest version of a profile, as just read."""
        self._agents.put((tenant_id, agent.name), agent)

    def forget(self, tenant_id: str, conversation_id: str, agent_name: str) -> None:
        """Forget a conversation and a profile whose check failed."""
        self._conversations.pop((tenant_id, conversation_id))
        self._agents.pop((tenant_id, agent_name))
