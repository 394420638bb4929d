"""The LangGraph API's store endpoints over agentrt's store (LangGraph's Postgres store).

It is the store graphs reach with `get_store()` and the long-term memory lives in, so a
`query` is a semantic search with the configured embeddings. Namespaces start with a label;
a caller who is not a tenant admin may use only those whose first label is its tenant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from langgraph.store.base import BaseStore, Item, SearchItem

from server.auth import Principal
from server.errors import InvalidGraphRequestError, LangGraphItemNotFoundError, MemoryForbiddenError
from server.timestamps import iso

# The store encodes a filter's values with orjson, which holds integers of 64 bits at most.
_INT_RANGE = (-(2**63), 2**64 - 1)


def _wide_integer(value: Any) -> int | None:
    """Return the first integer in a JSON value outside the 64-bit range, or None."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, bool):
            continue
        if isinstance(item, int) and not _INT_RANGE[0] <= item <= _INT_RANGE[1]:
            return item
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return None


def item_view(item: Item | SearchItem) -> dict[str, Any]:
    """Return a store item as LangGraph's `Item` (with `score` from a search)."""
    view: dict[str, Any] = {
        "namespace": list(item.namespace),
        "key": item.key,
        "value": item.value,
        "created_at": iso(item.created_at),
        "updated_at": iso(item.updated_at),
    }
    if isinstance(item, SearchItem):
        view["score"] = item.score
    return view


def _check_labels(labels: list[str] | tuple[str, ...]) -> list[str]:
    if any(not isinstance(p, str) or not p or "." in p for p in labels):
        raise InvalidGraphRequestError(
            "namespace labels are non-empty and have no dots, e.g. ['notes', 'u1']"
        )
    return list(labels)


@dataclass(frozen=True)
class StoreGate:
    """The store as one caller may use it."""

    store: BaseStore
    who: Principal

    def _allowed(self, namespace: list[str] | tuple[str, ...]) -> tuple[str, ...]:
        _check_labels(namespace)
        if not namespace:
            raise InvalidGraphRequestError("a namespace has at least one label")
        if not self.who.has_role("admin") and namespace[0] != self.who.tenant_id:
            raise MemoryForbiddenError(
                f"namespaces must start with your tenant {self.who.tenant_id!r}"
            )
        return tuple(namespace)

    async def put(self, body: dict[str, Any]) -> None:
        """Store `value` under `namespace` and `key` (indexed unless `index` is false)."""
        value = body.get("value")
        if not isinstance(value, dict):
            raise InvalidGraphRequestError("`value` must be a JSON object")
        index = body.get("index")
        await self.store.aput(
            self._allowed(body.get("namespace") or []),
            str(body.get("key") or ""),
            value,
            index=index if index is False or isinstance(index, list) else None,
            ttl=body.get("ttl"),
        )

    async def get(
        self, namespace: str, key: str, refresh_ttl: bool | None = None
    ) -> dict[str, Any]:
        """Return the item (renewing its ttl unless `refresh_ttl` is false), or raise."""
        found = await self.store.aget(
            self._allowed(namespace.split(".")), key, refresh_ttl=refresh_ttl
        )
        if found is None:
            raise LangGraphItemNotFoundError(f"no item {key!r} in namespace {namespace!r}")
        return item_view(found)

    async def delete(self, body: dict[str, Any]) -> None:
        """Delete the item at `namespace` and `key`."""
        await self.store.adelete(self._allowed(body.get("namespace") or []), str(body["key"]))

    async def search(self, body: dict[str, Any]) -> dict[str, Any]:
        """Search under `namespace_prefix` by `filter` and, with `query`, by meaning."""
        prefix = body.get("namespace_prefix") or []
        if prefix or not self.who.has_role("admin"):
            prefix = list(self._allowed(prefix))
        wide = _wide_integer(body.get("filter"))
        if wide is not None:
            raise InvalidGraphRequestError(
                f"filter: the integer {wide} is outside the range the store compares "
                f"(-2^63 to 2^64-1)"
            )
        try:
            found = await self.store.asearch(
                tuple(prefix),
                query=body.get("query"),
                filter=body.get("filter"),
                limit=int(body.get("limit") or 10),
                offset=int(body.get("offset") or 0),
                refresh_ttl=body.get("refresh_ttl"),
            )
        except ValueError as exc:  # the store refuses a filter operator it does not know
            raise InvalidGraphRequestError(f"filter: {exc}") from exc
        return {"items": [item_view(i) for i in found]}

    async def namespaces(self, body: dict[str, Any]) -> dict[str, Any]:
        """List namespaces by `prefix`, `suffix` and `max_depth`."""
        prefix = body.get("prefix") or []
        if prefix or not self.who.has_role("admin"):
            prefix = list(self._allowed(prefix or [self.who.tenant_id]))
        found = await self.store.alist_namespaces(
            prefix=tuple(prefix) or None,
            suffix=tuple(_check_labels(body.get("suffix") or [])) or None,
            max_depth=body.get("max_depth"),
            limit=int(body.get("limit") or 100),
            offset=int(body.get("offset") or 0),
        )
        return {"namespaces": [list(n) for n in found]}
