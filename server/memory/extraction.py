"""What a completed exchange teaches: ask a model, merge with what is stored, report it.

The model answers through one tool call (`save_memories`) whose arguments are the plan: add,
update or delete, each with a reason. Existing memories similar to the exchange are shown to
it under short references (`m1`, `m2`...), so that it updates or deletes a contradicted item
instead of adding a second one; an added item that is nearly identical to a stored one
updates that one instead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Literal

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.tools import StructuredTool
from pydantic import BaseModel, Field, ValidationError

from graphs.context import ModelCaller
from tools.memory.book import MAX_TEXT, Memory, MemoryBook

SAVE_TOOL = "save_memories"
EXISTING_LIMIT = 10

EXTRACTION_PROMPT = """\
You maintain the long-term memory of an assistant. Read the exchange between the user and \
the assistant, and the memories already stored about this user (each with a reference such \
as m1). Keep only what will still be useful in later, unrelated conversations: lasting \
preferences, facts about the user and their work, instructions on how the assistant should \
behave, notable episodes. Do not keep small talk, one-off requests, or what the assistant \
said unless the user confirmed it.

Call save_memories exactly once with the operations:
- add: a new memory, one short self-contained sentence in the third person.
- update: a stored memory (by its reference) that the exchange corrects or refines; give the \
full new text.
- delete: a stored memory (by its reference) the exchange shows to be wrong or that the user \
asked to forget.
Give a short reason for each. Prefer update over add when a stored memory is about the same \
thing. Call it with no operations when nothing is worth keeping."""


class MemoryOperation(BaseModel):
    """One change to long-term memory."""

    action: Literal["add", "update", "delete"]
    ref: str | None = Field(
        default=None, description="The stored memory's reference (m1, m2...) to update or delete."
    )
    text: str | None = Field(
        default=None, max_length=MAX_TEXT, description="The memory (add, update)."
    )
    kind: Literal["fact", "preference", "instruction", "episode"] = "fact"
    confidence: float = Field(default=0.8, ge=0.0, le=1.0)
    reason: str = Field(default="", max_length=500)


class ExtractionPlan(BaseModel):
    """The changes to make; none when nothing is worth keeping."""

    operations: list[MemoryOperation] = Field(default_factory=list)


def _save_memories(**_: Any) -> str:
    return "saved"


SAVE_MEMORIES = StructuredTool.from_function(
    func=_save_memories,
    name=SAVE_TOOL,
    description="Save the changes to the user's long-term memory.",
    args_schema=ExtractionPlan,
)


def render_request(exchange: str, existing: Sequence[Memory]) -> str:
    """Return the user message of the extraction call."""
    stored = (
        "\n".join(f"m{i}: [{m.kind}] {m.text}" for i, m in enumerate(existing, start=1)) or "(none)"
    )
    return f"Stored memories:\n{stored}\n\nThe exchange:\n{exchange}"


def read_plan(message: AIMessage) -> ExtractionPlan:
    """Return the plan the model's `save_memories` call carries (empty without one).

    Raises:
        ValidationError: the call's arguments are not a plan.
    """
    for call in message.tool_calls:
        if call["name"] == SAVE_TOOL:
            return ExtractionPlan.model_validate(call["args"])
    return ExtractionPlan()


async def decide(
    caller: ModelCaller,
    exchange: str,
    existing: Sequence[Memory],
    emit: Callable[[Any], None],
) -> ExtractionPlan:
    """Ask the extraction model what to keep; an answer that is not a plan keeps nothing."""
    messages = [SystemMessage(EXTRACTION_PROMPT), HumanMessage(render_request(exchange, existing))]
    message = await caller.call(messages, [SAVE_MEMORIES], emit, step=0)
    try:
        return read_plan(message)
    except ValidationError:
        return ExtractionPlan()


def memory_id(job_id: str, position: int) -> str:
    """The id of the `position`th memory a job adds: the same on every retry of the job."""
    digest = hashlib.sha256(f"{job_id}:{position}".encode()).hexdigest()[:20]
    return f"mem_{digest}"


async def apply_plan(
    book: MemoryBook,
    plan: dict[str, Any],
    *,
    job_id: str,
    tenant_id: str,
    user_id: str,
    run_id: str,
    message_id: str | None,
    duplicate_similarity: float,
) -> dict[str, list[dict[str, Any]]]:
    """Apply a saved plan; safe to repeat (ids and values are the same every time).

    Returns:
        What was added, updated and removed, each with its reason.
    """
    refs: dict[str, dict[str, Any]] = plan.get("refs", {})
    own = {memory_id(job_id, i) for i in range(len(plan["operations"]))}
    added: list[dict[str, Any]] = []
    updated: list[dict[str, Any]] = []
    removed: list[dict[str, Any]] = []
    for position, raw in enumerate(plan["operations"]):
        op = MemoryOperation.model_validate(raw)
        target = refs.get(op.ref or "")
        if op.action == "delete":
            if target is None:
                continue
            gone = await book.get(tenant_id, user_id, target["id"])
            if gone is not None:
                await book.delete(gone)
            removed.append({"id": target["id"], "text": target["text"], "reason": op.reason})
            continue
        text = (op.text or "").strip()
        if not text:
            continue
        reason = op.reason
        if op.action == "add":
            near = await book.search(
                tenant_id, user_id=user_id, scope="user", query=text, kind=op.kind, limit=3
            )
            twin = next(
                (
                    m
                    for m in near
                    if m.id not in own and (m.similarity or 0.0) >= duplicate_similarity
                ),
                None,
            )
            if twin is not None:
                target = {"id": twin.id, "text": twin.text}
                reason = f"{reason} (near-duplicate of a stored memory)".strip()
        item = Memory(
            id=target["id"] if target else memory_id(job_id, position),
            tenant_id=tenant_id,
            user_id=user_id,
            text=text,
            kind=op.kind,
            confidence=op.confidence,
            source_run_id=run_id,
            source_message_id=message_id,
            created_by="extraction",
        )
        if target is not None:
            previous = await book.get(tenant_id, user_id, target["id"])
            if previous is not None:
                item = replace(item, created_by=previous.created_by or "extraction")
            await book.put(item)
            updated.append(
                {"id": item.id, "text": text, "previous": target["text"], "reason": reason}
            )
        else:
            await book.put(item)
            added.append({"id": item.id, "text": text, "kind": op.kind, "reason": reason})
    return {"added": added, "updated": updated, "removed": removed}
