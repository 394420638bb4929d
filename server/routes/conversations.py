"""Conversations and the message that starts a run."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Header, HTTPException, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field

from server.auth import CurrentPrincipal, Principal
from server.idempotency import HEADER as IDEMPOTENCY_HEADER
from server.idempotency import idempotency_key
from server.routing import pick_model
from server.store import (
    accept_message,
    conversation_view,
    create_conversation,
    get_conversation,
    list_messages,
    list_runs,
    message_view,
    run_view,
)

router = APIRouter(prefix="/api/conversations", tags=["conversations"])


class ConversationIn(BaseModel):
    """Body of `POST /api/conversations`."""

    model_config = ConfigDict(extra="forbid")

    title: str | None = Field(default=None, max_length=500)
    model: str | None = Field(default=None, description="Default model for this conversation.")
    metadata: dict[str, Any] = Field(default_factory=dict)


class RunOptions(BaseModel):
    """Per-run options."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    max_steps: int | None = Field(default=None, ge=1, le=200, alias="maxSteps")
    timeout_seconds: float | None = Field(
        default=None, gt=0, le=7 * 24 * 3600, alias="timeoutSeconds"
    )
    tools: list[str] | None = Field(
        default=None, description="Only these tools (of those the tenant allows) for this run."
    )
    needs: list[str] | None = Field(
        default=None, description="Capabilities the run needs (e.g. 'reasoning'), for routing."
    )
    max_tokens: int | None = Field(default=None, ge=1, alias="maxTokens")
    max_cost: Decimal | None = Field(default=None, ge=0, alias="maxCost")
    max_model_calls: int | None = Field(default=None, ge=1, alias="maxModelCalls")


class MessageIn(BaseModel):
    """Body of `POST /api/conversations/{id}/messages`."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    content: str
    model: str | None = None
    options: RunOptions = Field(default_factory=RunOptions)
    if_busy: Literal["enqueue", "reject", "interrupt"] | None = Field(
        default=None,
        alias="ifBusy",
        description="When the conversation has a run in progress; the server's "
        "AGENTRT_CONVERSATION_BUSY_POLICY by default.",
    )


@router.post("", status_code=status.HTTP_201_CREATED)
async def post_conversation(
    request: Request,
    body: Annotated[ConversationIn | None, Body()] = None,
    who: Principal = CurrentPrincipal,
) -> dict[str, Any]:
    """Create a conversation (a LangGraph thread)."""
    body = body or ConversationIn()
    if body.model is not None:
        request.app.state.models.validate(body.model)
    row = await create_conversation(
        request.app.state.pool, who, body.title, body.model, body.metadata
    )
    return conversation_view(row)


@router.get("/{conversation_id}")
async def get_conversation_route(
    request: Request, conversation_id: str, who: Principal = CurrentPrincipal
) -> dict[str, Any]:
    """Return one conversation."""
    async with request.app.state.pool.connection() as conn:
        return conversation_view(await get_conversation(conn, who, conversation_id))


@router.post("/{conversation_id}/messages", status_code=status.HTTP_202_ACCEPTED)
async def post_message(
    request: Request,
    response: Response,
    conversation_id: str,
    body: MessageIn,
    who: Principal = CurrentPrincipal,
    key: Annotated[
        str | None,
        Header(
            alias=IDEMPOTENCY_HEADER,
            description="A unique string of 1 to 255 printable ASCII characters (a UUID). A "
            "retry with the same key and body returns the first answer and creates nothing; "
            "with another body it is refused (422).",
        ),
    ] = None,
) -> dict[str, Any]:
    """Store a user message and queue a run for it; answers at once."""
    settings = request.app.state.settings
    if not body.content.strip():
        raise HTTPException(422, "content must not be empty")
    if len(body.content) > settings.max_message_chars:
        raise HTTPException(
            413,
            f"content has {len(body.content)} characters; the limit is "
            f"{settings.max_message_chars} (AGENTRT_MAX_MESSAGE_CHARS)",
        )
    idempotency = idempotency_key(key, body.model_dump(by_alias=True, mode="json"))
    pool = request.app.state.pool
    async with pool.connection() as conn:
        conversation = await get_conversation(conn, who, conversation_id)
    pick = pick_model(
        requested=body.model,
        conversation_model=conversation["model"],
        text=body.content,
        needs=body.options.needs or [],
        rules=settings.model_routes,
        default=settings.default_model,
    )
    model = request.app.state.models.validate(pick.model_id)
    options = body.options.model_dump(by_alias=True, exclude_none=True, mode="json")
    limits = settings.tenant_limits.get(who.tenant_id, {})
    user_limit = limits.get("userMaxActiveRuns", settings.user_max_active_runs)
    accepted, replayed = await accept_message(
        pool,
        who,
        conversation_id,
        body.content,
        model,
        options,
        if_busy=body.if_busy or settings.conversation_busy_policy,
        user_limit=user_limit if settings.limit_policy == "reject" else None,
        model_source=pick.source,
        idempotency=idempotency,
    )
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    else:
        request.app.state.runtime.metrics.events_written.inc()  # run.created
    return accepted


@router.get("/{conversation_id}/runs")
async def get_conversation_runs(
    request: Request, conversation_id: str, who: Principal = CurrentPrincipal
) -> dict[str, Any]:
    """List the conversation's runs, newest first."""
    rows = await list_runs(request.app.state.pool, who, conversation_id)
    return {"runs": [run_view(r) for r in rows]}


@router.get("/{conversation_id}/messages")
async def get_conversation_messages(
    request: Request, conversation_id: str, who: Principal = CurrentPrincipal
) -> dict[str, Any]:
    """List the conversation's stored messages in order."""
    rows = await list_messages(request.app.state.pool, who, conversation_id)
    return {"messages": [message_view(r) for r in rows]}
