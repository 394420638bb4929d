"""Long-term memories kept in LangGraph's store, by tenant and user.

Namespaces: `(tenant, "users", user, "memories")` for what is known about one user and
`(tenant, "shared", "memories")` for the tenant's shared facts. An item's value holds its
text (the embedded field), kind, confidence, source run and message, and optional expiry;
the store keeps created/updated times. Every store call goes through `abatch` in the
caller's task, so the embedding calls it makes are attributed to the caller's scope.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, cast, get_args

from langgraph.store.base import BaseStore, GetOp, Item, PutOp, SearchItem, SearchOp

Kind = Literal["fact", "preference", "instruction", "episode"]
Scope = Literal["user", "tenant"]
KINDS: tuple[str, ...] = get_args(Kind)
MAX_TEXT = 2_000


def _label(value: str) -> str:
    # Store namespaces are joined with "." and may not contain it: escape ids that do.
    return value.replace("%", "%25").replace(".", "%2E") or "%00"


def _unlabel(value: str) -> str:
    return "" if value == "%00" else value.replace("%2E", ".").replace("%25", "%")


def namespace(tenant_id: str, scope: Scope, user_id: str | None = None) -> tuple[str, ...]:
    """Return the store namespace of a user's memories or of the tenant's shared ones."""
    if scope == "user":
        if not user_id:
            raise ValueError("a user's memories need the user id")
        return (_label(tenant_id), "users", _label(user_id), "memories")
    return (_label(tenant_id), "shared", "memories")


def tenant_prefix(tenant_id: str) -> tuple[str, ...]:
    """Return the namespace prefix of everything a tenant remembers."""
    return (_label(tenant_id),)


@dataclass(frozen=True)
class Memory:
    """One remembered item.

    Attributes:
        id: Its key in the store.
        tenant_id, user_id: Whose (user_id None: the tenant's shared memory).
        text: What is remembered, one self-contained sentence.
        kind: fact, preference, instruction or episode.
        confidence: 0..1, how sure the writer was.
        source_run_id, source_message_id: Where it was learnt (None when added by hand).
        created_at, updated_at: From the store.
        expires_at: Forgotten after this time, if set.
        similarity: Cosine similarity to a search text (searches only).
        score: Similarity blended with recency (recall only).
    """

    id: str
    tenant_id: str
    user_id: str | None
    text: str
    kind: str = "fact"
    confidence: float = 1.0
    source_run_id: str | None = None
    source_message_id: str | None = None
    created_by: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    expires_at: datetime | None = None
    similarity: float | None = None
    score: float | None = None

    @property
    def scope(self) -> Scope:
        """`user` or `tenant`."""
        return "user" if self.user_id is not None else "tenant"

    def value(self) -> dict[str, Any]:
        """Return the store value."""
        return {
            "text": self.text,
            "kind": self.kind,
            "confidence": self.confidence,
            "tenantId": self.tenant_id,
            "userId": self.user_id,
            "scope": self.scope,
            "sourceRunId": self.source_run_id,
            "sourceMessageId": self.source_message_id,
            "createdBy": self.created_by,
            "expiresAt": self.expires_at.isoformat() if self.expires_at else None,
        }

    def to_json(self) -> dict[str, Any]:
        """Render for the API and tools."""
        out: dict[str, Any] = {
            "id": self.id,
            "tenantId": self.tenant_id,
            "userId": self.user_id,
            "scope": self.scope,
            "text": self.text,
            "kind": self.kind,
            "confidence": self.confidence,
            "sourceRunId": self.source_run_id,
            "sourceMessageId": self.source_message_id,
            "createdBy": self.created_by,
            "createdAt": self.created_at.isoformat() if self.created_at else None,
            "updatedAt": self.updated_at.isoformat() if self.updated_at else None,
            "expiresAt": self.expires_at.isoformat() if self.expires_at else None,
        }
        if self.similarity is not None:
            out["similarity"] = round(self.similarity, 4)
        if self.score is not None:
            out["score"] = round(self.score, 4)
        return out

    def expired(self, now: datetime) -> bool:
        """Say whether the item is past its expiry."""
        return self.expires_at is not None and self.expires_at <= now


def _time(value: Any) -> datetime | None:
    if not value:
        return None
    if isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


def from_item(item: Item) -> Memory:
    """Read a store item back as a `Memory`."""
    value = item.value
    similarity = item.score if isinstance(item, SearchItem) else None
    return Memory(
        id=item.key,
        tenant_id=str(value.get("tenantId") or _unlabel(item.namespace[0])),
        user_id=value.get("userId"),
        text=str(value.get("text", "")),
        kind=str(value.get("kind", "fact")),
        confidence=float(value.get("confidence", 1.0)),
        source_run_id=value.get("sourceRunId"),
        source_message_id=value.get("sourceMessageId"),
        created_by=value.get("createdBy"),
        created_at=item.created_at,
        updated_at=item.updated_at,
        expires_at=_time(value.get("expiresAt")),
        similarity=None if similarity is None else float(similarity),
    )


def new_id() -> str:
    """Return a fresh memory id."""
    return f"mem_{uuid.uuid4().hex[:20]}"


@dataclass(frozen=True)
class RecallPolicy:
    """How recall ranks and cuts (a profile's `memory` settings).

    Attributes:
        limit: Most items returned.
        min_similarity: Items less similar than this to the message are left out.
        recency_weight: Share of the score given to recency (0: similarity only).
        half_life_days: Age at which an item's recency is halved.
        include_shared: Search the tenant's shared memories too.
    """

    limit: int = 8
    min_similarity: float = 0.2
    recency_weight: float = 0.15
    half_life_days: float = 90.0
    include_shared: bool = True


def blend(
    similarity: float, updated_at: datetime | None, now: datetime, policy: RecallPolicy
) -> float:
    """Return `(1 - w) * similarity + w * 0.5 ** (age / half life)`."""
    age_days = max(0.0, (now - (updated_at or now)).total_seconds() / 86_400)
    recency = math.pow(0.5, age_days / max(policy.half_life_days, 1e-6))
    return (1 - policy.recency_weight) * similarity + policy.recency_weight * recency


@dataclass
class MemoryBook:
    """Read and write memories in a LangGraph store."""

    store: BaseStore
    now: Any = field(default=lambda: datetime.now(UTC))

    async def put(self, memory: Memory) -> Memory:
        """Store (insert or replace) `memory`; return it as stored."""
        ns = namespace(memory.tenant_id, memory.scope, memory.user_id)
        await self.store.abatch([PutOp(ns, memory.id, memory.value(), index=["text"])])
        stored = await self.get(memory.tenant_id, memory.user_id, memory.id)
        assert stored is not None
        return stored

    async def get(self, tenant_id: str, user_id: str | None, memory_id: str) -> Memory | None:
        """Return one memory of the user (or of the tenant when `user_id` is None)."""
        scope: Scope = "user" if user_id is not None else "tenant"
        found = await self.store.abatch([GetOp(namespace(tenant_id, scope, user_id), memory_id)])
        item = found[0]
        return from_item(cast(Item, item)) if item is not None else None

    async def delete(self, memory: Memory) -> None:
        """Delete `memory` (its vector goes with it)."""
        ns = namespace(memory.tenant_id, memory.scope, memory.user_id)
        await self.store.abatch([PutOp(ns, memory.id, None)])

    async def search(
        self,
        tenant_id: str,
        *,
        user_id: str | None = None,
        scope: Scope | None = None,
        query: str | None = None,
        kind: str | None = None,
        limit: int = 20,
        offset: int = 0,
    ) -> list[Memory]:
        """Search (by similarity to `query`) or list (newest first) memories.

        `user_id` with scope None: that user's and the shared ones; scope `tenant`: the
        shared ones; neither: everything the tenant remembers (admins).
        """
        prefixes: list[tuple[str, ...]]
        if scope == "tenant":
            prefixes = [namespace(tenant_id, "tenant")]
        elif user_id is not None:
            prefixes = [namespace(tenant_id, "user", user_id)]
            if scope is None:
                prefixes.append(namespace(tenant_id, "tenant"))
        else:
            prefixes = [tenant_prefix(tenant_id)]
        where = {"kind": kind} if kind else None
        ops = [
            SearchOp(p, filter=where, limit=limit + offset, offset=0, query=query) for p in prefixes
        ]
        results = await self.store.abatch(ops)
        now = self.now()
        found = [from_item(i) for items in results for i in cast(list[SearchItem], items)]
        found = [m for m in found if not m.expired(now)]
        if query:
            found.sort(key=lambda m: m.similarity or 0.0, reverse=True)
        else:
            found.sort(key=lambda m: m.updated_at or now, reverse=True)
        return found[offset : offset + limit]

    async def recall(
        self, tenant_id: str, user_id: str, query: str, policy: RecallPolicy
    ) -> list[Memory]:
        """Return the best memories for `query`: similar enough, blended with recency."""
        if not query.strip():
            return []
        scope: Scope | None = None if policy.include_shared else "user"
        candidates = await self.search(
            tenant_id, user_id=user_id, scope=scope, query=query, limit=policy.limit * 3
        )
        now = self.now()
        scored = [
            _scored(m, blend(m.similarity or 0.0, m.updated_at, now, policy))
            for m in candidates
            if (m.similarity or 0.0) >= policy.min_similarity
        ]
        scored.sort(key=lambda m: m.score or 0.0, reverse=True)
        return scored[: policy.limit]


def _scored(memory: Memory, score: float) -> Memory:
    return replace(memory, score=score)


def check_text(text: str) -> str:
    """Return the stripped text, or raise ValueError saying what is wrong with it."""
    text = text.strip()
    if not text:
        raise ValueError("a memory needs text")
    if len(text) > MAX_TEXT:
        raise ValueError(f"a memory is at most {MAX_TEXT} characters, not {len(text)}")
    return text


def check_kind(kind: str) -> str:
    """Return `kind` if it is one of KINDS, else raise ValueError naming them."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one of {', '.join(KINDS)}")
    return kind


def expiry(days: float | None, now: datetime) -> datetime | None:
    """Return the expiry `days` from `now` (None: never)."""
    return None if days is None else now + timedelta(days=days)


def policy_from(settings: Mapping[str, Any]) -> RecallPolicy:
    """Read a profile's `memory.recall` settings (already validated)."""
    keys = {"limit", "min_similarity", "recency_weight", "half_life_days", "include_shared"}
    return RecallPolicy(**{k: v for k, v in settings.items() if k in keys})
