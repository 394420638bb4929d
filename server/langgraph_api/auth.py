"""LangGraph's custom auth (`auth.path` in langgraph.json) for the LangGraph API.

The `langgraph_sdk.Auth` object's `@auth.authenticate` handler names the caller from the
request; its `@auth.on.<resource>.<action>` handlers may refuse the request, change the
value (e.g. add an `owner` to a thread's metadata) and return metadata filters (`{"owner":
"u1"}`, `{"k": {"$eq": v}}`, `{"tags": {"$contains": v}}`) that agentrt applies in SQL.
The caller is then a user of the default tenant; who sees what is the handlers' decision.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from langgraph_sdk import Auth
from langgraph_sdk.auth.exceptions import HTTPException as AuthHTTPException
from langgraph_sdk.auth.types import AuthContext
from psycopg.types.json import Jsonb

from server.auth import Principal
from server.errors import ForbiddenError, UnauthorizedError

Filters = dict[str, Any]


@dataclass(frozen=True)
class AuthUser:
    """The user an `@auth.authenticate` handler named."""

    identity: str
    permissions: tuple[str, ...] = ()
    display_name: str = ""
    is_authenticated: bool = True

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def __contains__(self, key: str) -> bool:
        return key in ("identity", "permissions", "display_name", "is_authenticated")

    def __iter__(self) -> Iterator[str]:
        return iter(("identity", "permissions", "display_name", "is_authenticated"))


def _user(found: Any) -> AuthUser:
    if isinstance(found, str):
        return AuthUser(found)
    if isinstance(found, Mapping):
        identity = str(found["identity"])
        perms = tuple(found.get("permissions") or ())
        return AuthUser(identity, perms, str(found.get("display_name") or identity))
    identity = str(found.identity)
    perms = tuple(getattr(found, "permissions", ()) or ())
    return AuthUser(identity, perms, str(getattr(found, "display_name", identity)))


def _refusal(exc: AuthHTTPException) -> Exception:
    detail = str(exc.detail or "refused by the auth handler")
    return ForbiddenError(detail) if exc.status_code == 403 else UnauthorizedError(detail)


@dataclass(frozen=True)
class GraphAuth:
    """The loaded `Auth` object, and the tenant its users belong to."""

    auth: Auth
    tenant_id: str

    async def authenticate(self, request: Request) -> tuple[Principal, AuthUser]:
        """Name the caller with the `@auth.authenticate` handler.

        Raises:
            UnauthorizedError: the handler refused (or there is none to name the caller).
        """
        handler = self.auth._authenticate_handler
        if handler is None:
            raise UnauthorizedError("langgraph.json's auth object has no @auth.authenticate")
        offered = {
            "request": request,
            "path": request.url.path,
            "method": request.method,
            "path_params": dict(request.path_params),
            "query_params": dict(request.query_params),
            "headers": {k.encode(): v.encode() for k, v in request.headers.items()},
            "authorization": request.headers.get("authorization"),
        }
        wanted = inspect.signature(handler).parameters
        try:
            found = await handler(**{k: v for k, v in offered.items() if k in wanted})
        except AuthHTTPException as exc:
            raise _refusal(exc) from exc
        user = _user(found)
        # Within the tenant, the handlers decide who sees what (their filters), not ownership.
        return Principal(self.tenant_id, user.identity, frozenset({"admin"})), user

    async def authorize(
        self, user: AuthUser, resource: str, action: str, value: dict[str, Any]
    ) -> Filters:
        """Run the handler of `resource`.`action` on `value` (changed in place); return filters.

        Raises:
            ForbiddenError: the handler refused.
        """
        handler = None
        for key in ((resource, action), (resource, "*"), ("*", action), ("*", "*")):
            if self.auth._handlers.get(key):
                handler = self.auth._handlers[key][-1]
                break
        if handler is None and self.auth._global_handlers:
            handler = self.auth._global_handlers[-1]
        if handler is None:
            return {}
        ctx = AuthContext(
            permissions=list(user.permissions),
            user=user,
            resource=resource,  # type: ignore[arg-type]
            action=action,  # type: ignore[arg-type]
        )
        try:
            result = await handler(ctx=ctx, value=value)
        except AuthHTTPException as exc:
            raise _refusal(exc) from exc
        if result is False:
            raise ForbiddenError(f"not allowed to {action} {resource}")
        return dict(result) if isinstance(result, Mapping) else {}


def metadata_sql(filters: Filters, column: str) -> tuple[str, list[Any]]:
    """Render metadata filters as SQL over the jsonb `column` (empty: no condition)."""
    clauses, args = [], []
    for key, want in filters.items():
        if isinstance(want, Mapping) and "$contains" in want:
            clauses.append(f"{column} -> %s @> %s")
            item = want["$contains"]
            args += [key, Jsonb(item if isinstance(item, list) else [item])]
        else:
            value = want["$eq"] if isinstance(want, Mapping) and "$eq" in want else want
            clauses.append(f"{column} @> %s")
            args.append(Jsonb({key: value}))
    return " AND ".join(clauses), args


def matches(filters: Filters, metadata: Mapping[str, Any]) -> bool:
    """Say whether `metadata` passes the filters (the same rules as `metadata_sql`)."""
    for key, want in filters.items():
        have = metadata.get(key)
        if isinstance(want, Mapping) and "$contains" in want:
            items = (
                want["$contains"] if isinstance(want["$contains"], list) else [want["$contains"]]
            )
            if not isinstance(have, list) or any(i not in have for i in items):
                return False
        elif have != (want["$eq"] if isinstance(want, Mapping) and "$eq" in want else want):
            return False
    return True
