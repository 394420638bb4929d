"""Memories for people: list, search, read, add, change and delete, with tenant and role checks.

Everyone works inside their tenant. A user manages what is remembered about them; an admin
manages every user's memories and the tenant's shared ones.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from langgraph.store.base import BaseStore

from nodes.embeddings.embedder import EmbeddingScope, embedding_scope
from server.auth import Principal
from server.errors import InvalidMemoryError, MemoryForbiddenError, MemoryNotFoundError
from tools.memory.book import Memory, MemoryBook, Scope, check_kind, check_text, expiry, new_id


def _forbidden(message: str) -> MemoryForbiddenError:
    return MemoryForbiddenError(message)


def _invalid(exc: ValueError) -> InvalidMemoryError:
    return InvalidMemoryError(str(exc))


class MemoryService:
    """The API's and the CLI's view of the memory store, for one caller."""

    def __init__(self, store: BaseStore, who: Principal) -> None:
        self.book = MemoryBook(store)
        self.who = who
        self.scope = EmbeddingScope(who.tenant_id, who.user_id, None, "api")

    def _whose(self, user_id: str | None, scope: Scope) -> str | None:
        """Return the user whose memories are meant (None: the shared ones), if allowed."""
        if scope == "tenant":
            return None
        user = user_id or self.who.user_id
        if user != self.who.user_id and not self.who.has_role("admin"):
            raise _forbidden(
                "a user manages only their own memories; another user's need the admin role"
            )
        return user

    def _may_change_shared(self) -> None:
        if not self.who.has_role("admin"):
            raise _forbidden("the tenant's shared memories are changed by admins only")

    async def search(
        self,
        *,
        query: str | None,
        user_id: str | None,
        scope: Scope | None,
        kind: str | None,
        limit: int,
        offset: int,
    ) -> list[Memory]:
        """List (newest first) or search (most similar first) the memories the caller may see."""
        if kind is not None:
            try:
                check_kind(kind)
            except ValueError as exc:
                raise _invalid(exc) from exc
        every_user = user_id is None and scope is None and self.who.has_role("admin")
        user = None if every_user or scope == "tenant" else self._whose(user_id, "user")
        with embedding_scope(self.scope):
            return await self.book.search(
                self.who.tenant_id,
                user_id=user,
                scope=scope,
                query=query or None,
                kind=kind,
                limit=limit,
                offset=offset,
            )

    async def get(self, memory_id: str, user_id: str | None = None) -> Memory:
        """Return one memory of the user (or a shared one); 404 when there is none."""
        user = self._whose(user_id, "user")
        found = await self.book.get(self.who.tenant_id, user, memory_id)
        if found is None:
            found = await self.book.get(self.who.tenant_id, None, memory_id)
        if found is None:
            raise MemoryNotFoundError(f"no memory {memory_id} for user {user} or the tenant")
        return found

    async def create(self, body: dict[str, Any]) -> Memory:
        """Add a memory (`scope` user by default; `tenant` for admins)."""
        scope: Scope = body.get("scope") or "user"
        if scope == "tenant":
            self._may_change_shared()
        user = self._whose(body.get("userId"), scope)
        now = datetime.now(UTC)
        try:
            memory = Memory(
                id=new_id(),
                tenant_id=self.who.tenant_id,
                user_id=user,
                text=check_text(body["text"]),
                kind=check_kind(body.get("kind") or "fact"),
                confidence=float(body.get("confidence", 1.0)),
                created_by=f"api:{self.who.user_id}",
                expires_at=expiry(body.get("expiresInDays"), now),
            )
        except ValueError as exc:
            raise _invalid(exc) from exc
        with embedding_scope(self.scope):
            return await self.book.put(memory)

    async def update(self, memory_id: str, body: dict[str, Any], user_id: str | None) -> Memory:
        """Change a memory's text, kind, confidence or expiry."""
        memory = await self.get(memory_id, user_id)
        if memory.scope == "tenant":
            self._may_change_shared()
        changes: dict[str, Any] = {}
        try:
            if body.get("text") is not None:
                changes["text"] = check_text(body["text"])
            if body.get("kind") is not None:
                changes["kind"] = check_kind(body["kind"])
        except ValueError as exc:
            raise _invalid(exc) from exc
        if body.get("confidence") is not None:
            changes["confidence"] = float(body["confidence"])
        if "expiresInDays" in body:
            changes["expires_at"] = expiry(body["expiresInDays"], datetime.now(UTC))
        with embedding_scope(self.scope):
            return await self.book.put(replace(memory, **changes))

    async def delete(self, memory_id: str, user_id: str | None) -> Memory:
        """Delete one memory."""
        memory = await self.get(memory_id, user_id)
        if memory.scope == "tenant":
            self._may_change_shared()
        await self.book.delete(memory)
        return memory

    async def forget_user(self, user_id: str | None) -> int:
        """Delete everything remembered about a user; return how many memories went."""
        user = self._whose(user_id, "user")
        count = 0
        while True:
            batch = await self.book.search(
                self.who.tenant_id, user_id=user, scope="user", limit=100
            )
            if not batch:
                return count
            for memory in batch:
                await self.book.delete(memory)
            count += len(batch)
