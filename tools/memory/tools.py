"""The memory tools: `remember`, `recall` and `forget`, on the store of the running graph.

They reach the store and the run's memory settings through LangGraph's runtime, so they work
in any graph compiled with a store. The user's own memories are always theirs to manage; the
tenant's shared memories only for runs whose caller holds a role the profile allows.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from langchain_core.tools import ToolException
from langgraph.config import get_store
from langgraph.runtime import get_runtime

from tools.memory.book import (
    Memory,
    MemoryBook,
    RecallPolicy,
    check_kind,
    check_text,
    policy_from,
)
from tools.spec import CallContext, ToolSpec, agent_tool

MEMORY_TOOLS = ("remember", "recall", "forget")


def _run_memory() -> tuple[MemoryBook, Mapping[str, Any]]:
    """Return the store's memory book and the run's memory settings, or refuse plainly."""
    try:
        store = get_store()
        context = getattr(get_runtime(), "context", None)
    except RuntimeError as exc:
        raise ToolException("memory tools run only inside an agent run") from exc
    if store is None:
        raise ToolException("this agent has no memory store configured")
    setup = getattr(context, "context_setup", None)
    options = getattr(setup, "section_options", {}) or {}
    memory = options.get("memory") if isinstance(options, Mapping) else None
    settings: Mapping[str, Any] = memory if isinstance(memory, Mapping) else {}
    if settings.get("mode", "off") == "off":
        raise ToolException("long-term memory is off for this agent")
    return MemoryBook(store), settings


def _check_scope(scope: str, settings: Mapping[str, Any]) -> None:
    if scope not in ("user", "tenant"):
        raise ToolException(f"scope must be 'user' or 'tenant', not {scope!r}")
    if scope == "tenant" and not settings.get("tenant_write"):
        raise ToolException(
            "only users with a role the agent profile allows (memory.tenantWriteRoles) may "
            "change the tenant's shared memory; remember it for this user instead"
        )


@agent_tool(idempotent=True)
async def remember(
    text: str,
    call: CallContext,
    kind: Literal["fact", "preference", "instruction", "episode"] = "fact",
    scope: Literal["user", "tenant"] = "user",
) -> str:
    """Keep something worth knowing in later conversations (long-term memory).

    Use it when the user states a lasting preference, a fact about themselves or their work,
    or an instruction for how you should behave, or asks you to remember something. Write one
    short, self-contained sentence in the third person ("Prefers metric units").

    Args:
        text: What to remember, one self-contained sentence.
        kind: fact, preference, instruction (how to behave) or episode (something that
            happened).
        scope: user (about this user; the default) or tenant (shared with the whole
            organisation; only some roles may).
    """
    book, settings = _run_memory()
    _check_scope(scope, settings)
    try:
        text, checked_kind = check_text(text), check_kind(kind)
    except ValueError as exc:
        raise ToolException(str(exc)) from exc
    # The same tool call re-run after a crash writes the same item, not a second one.
    key = hashlib.sha256(call.idempotency_key.encode()).hexdigest()[:20]
    stored = await book.put(
        Memory(
            id=f"mem_{key}",
            tenant_id=call.tenant_id,
            user_id=call.user_id if scope == "user" else None,
            text=text,
            kind=checked_kind,
            source_run_id=call.run_id,
            created_by=f"tool:{call.user_id}",
        )
    )
    return json.dumps({"remembered": stored.to_json()})


@agent_tool(idempotent=True)
async def recall(query: str, call: CallContext, limit: int = 5) -> str:
    """Search long-term memory for what earlier conversations taught about this user.

    The most relevant memories are already shown in the system prompt; use this to look for
    something specific, or to find a memory's id before forgetting it.

    Args:
        query: What to look for, in a few words.
        limit: How many memories to return (1-20).
    """
    book, settings = _run_memory()
    if not 1 <= limit <= 20:
        raise ToolException("limit must be between 1 and 20")
    configured = policy_from(settings.get("recall") or {})
    policy = RecallPolicy(
        limit=limit,
        min_similarity=configured.min_similarity,
        recency_weight=configured.recency_weight,
        half_life_days=configured.half_life_days,
        include_shared=configured.include_shared,
    )
    found = await book.recall(call.tenant_id, call.user_id, query, policy)
    return json.dumps({"memories": [m.to_json() for m in found]})


@agent_tool(idempotent=True)
async def forget(memory_id: str, call: CallContext, reason: str = "") -> str:
    """Delete a memory that is wrong, outdated, or that the user wants forgotten.

    Find the id with `recall` first (ids look like `mem_...`).

    Args:
        memory_id: The memory's id.
        reason: Why it is forgotten, for the record.
    """
    book, settings = _run_memory()
    memory = await book.get(call.tenant_id, call.user_id, memory_id)
    if memory is None:
        memory = await book.get(call.tenant_id, None, memory_id)
        if memory is not None:
            _check_scope("tenant", settings)
    if memory is None:
        return json.dumps({"forgotten": None, "note": f"no memory {memory_id} (already gone?)"})
    await book.delete(memory)
    return json.dumps(
        {
            "forgotten": memory.to_json(),
            "reason": reason,
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
    )


def memory_tools() -> list[ToolSpec]:
    """Return the memory tools."""
    return [remember, recall, forget]
