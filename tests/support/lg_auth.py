"""A LangGraph `Auth` object for tests: bearer names are users; threads belong to their owner."""

from __future__ import annotations

from typing import Any

from langgraph_sdk import Auth

auth = Auth()


@auth.authenticate
async def authenticate(authorization: str | None) -> Auth.types.MinimalUserDict:
    """Take the bearer token as the user's name."""
    if not authorization or not authorization.startswith("Bearer "):
        raise Auth.exceptions.HTTPException(status_code=401, detail="send a bearer token")
    return {"identity": authorization.removeprefix("Bearer "), "permissions": []}


@auth.on.threads.create
async def own_new_threads(ctx: Auth.types.AuthContext, value: dict[str, Any]) -> None:
    """Record the creator as the thread's owner."""
    value.setdefault("metadata", {})["owner"] = ctx.user.identity


@auth.on.threads
async def only_own_threads(ctx: Auth.types.AuthContext, value: dict[str, Any]) -> dict[str, Any]:
    """Let a user read, update and run only the threads they own."""
    return {"owner": ctx.user.identity}


@auth.on.store
async def no_store_for_guests(ctx: Auth.types.AuthContext, value: dict[str, Any]) -> bool:
    """Refuse the store to the user `guest`."""
    return ctx.user.identity != "guest"
