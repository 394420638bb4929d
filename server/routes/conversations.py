"""Conversations and the message that starts a run."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Header, HTTPException, Query, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field

from server.agents.store import resolve_agent
from server.auth import CurrentPrincipal, Principal
from server.routes.guards import CleanText, is_blank, metadata_problem
from server.routes.schemas import (
    BODY_ERRORS,
    COMMON_ERRORS,
    Conversation,
    ConversationPage,
    MessageList,
    RunAccepted,
    RunPage,
    errors,
)
from server.runs.idempotency import HEADER as IDEMPOTENCY_HEADER
from server.runs.idempotency import idempotency_key
from server.runs.pages import conversations_page, runs_page
from server.runs.records import (
    accept_message,
    conversation_view,
    create_conversation,
    get_conversation,
    list_messages,
    message_view,
    run_view,
)
from server.usage.routing import pick_model

router = APIRouter(prefix="/api/conversations", tags=["conversations"], responses=COMMON_ERRORS)


class ConversationIn(BaseModel):
    """Body of `POST /api/conversations`."""

    model_config = ConfigDict(extra="forbid")

    title: str | None = Field(default=None, max_length=500)
    model: str | None = Field(default=None, description="Default model for this conversation.")
    agent: str | None = Field(
        default=None,
        max_length=80,
        description="The agent profile its runs use: `support` (its latest version at each "
        "message) or `support@3`; `default` when unset.",
    )
    metadata: dict[str, Any] = Field(default_factory=dict)


class RunOptions(BaseModel):
    """Per-run options."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    max_steps: int | None = Field(default=None, ge=1, le=200, alias="maxSteps")
    timeout_seconds: float | None = Field(
        default=None, gt=0, le=7 * 24 * 3600, allow_inf_nan=False, alias="timeoutSeconds"
    )
    tools: list[str] | None = Field(
        default=None, description="Only these tools (of those the tenant allows) for this run."
    )
    needs: list[str] | None = Field(
        default=None, description="Capabilities the run needs (e.g. 'reasoning'), for routing."
    )
    max_tokens: int | None = Field(default=None, ge=1, alias="maxTokens")
    max_cost: Decimal | None = Field(default=None, ge=0, allow_inf_nan=False, alias="maxCost")
    max_model_calls: int | None = Field(default=None, ge=1, alias="maxModelCalls")


class MessageIn(BaseModel):
    """Body of `POST /api/conversations/{id}/messages`."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    content: str
    model: str | None = None
    agent: str | None = Field(
        default=None,
        max_length=80,
        description="The agent profile for this run (`support` or `support@3`); the "
        "conversation's when unset.",
    )
    options: RunOptions = Field(default_factory=RunOptions)
    if_busy: Literal["enqueue", "reject", "interrupt"] | None = Field(
        default=None,
        alias="ifBusy",
        description="When the conversation has a run in progress; the server's "
        "AGENTRT_CONVERSATION_BUSY_POLICY by default.",
    )


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=Conversation,
    responses=BODY_ERRORS,
)
async def post_conversation(
    request: Request,
    body: Annotated[ConversationIn | None, CleanText, Body()] = None,
    who: Principal = CurrentPrincipal,
) -> dict[str, Any]:
    """Create a conversation (a LangGraph thread)."""
    body = body or ConversationIn()
    problem = metadata_problem(body.metadata, request.app.state.settings.max_metadata_bytes)
    if problem is not None:
        raise HTTPException(422, problem)
    if body.model is not None:
        request.app.state.models.validate(body.model)
    pool = request.app.state.pool
    if body.agent is not None:
        async with pool.connection() as conn:
            await resolve_agent(conn, who.tenant_id, body.agent)
    row = await create_conversation(pool, who, body.title, body.model, body.metadata, body.agent)
    return conversation_view(row)


@router.get("", response_model=ConversationPage)
async def get_conversations(
    request: Request,
    limit: int = Query(50, ge=1, le=500),
    cursor: str | None = Query(None, description="The `nextCursor` of the previous page."),
    who: Principal = CurrentPrincipal,
) -> dict[str, Any]:
    """List the tenant's conversations, newest first, a page at a time."""
    rows, next_cursor = await conversations_page(request.app.state.pool, who, cursor, limit)
    return {"conversations": [conversation_view(r) for r in rows], "nextCursor": next_cursor}


@router.get("/{conversation_id}", response_model=Conversation, responses=errors(404))
async def get_conversation_route(
    request: Request, conversation_id: str, who: Principal = CurrentPrincipal
) -> dict[str, Any]:
    """Return one conversation."""
    async with request.app.state.pool.connection() as conn:
        return conversation_view(await get_conversation(conn, who, conversation_id))


@router.post(
    "/{conversation_id}/messages",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=RunAccepted,
    responses={**BODY_ERRORS, **errors(404, 409, 429)},
)
async def post_message(
    request: Request,
    response: Response,
    conversation_id: str,
    body: Annotated[MessageIn, CleanText],
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
    if is_blank(body.content):
        raise HTTPException(
            422, "content must not be empty (it has only spaces or invisible characters)"
        )
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
        agent = await resolve_agent(conn, who.tenant_id, body.agent or conversation["agent"])
    pick = pick_model(
        requested=body.model,
        conversation_model=conversation["model"] or agent.spec.model,
        text=body.content,
        needs=body.options.needs or [],
        rules=settings.model_routes,
        default=settings.default_model,
    )
    model = request.app.state.models.validate(pick.model_id)
    options = body.options.model_dump(by_alias=True, exclude_none=True, mode="json")
    if agent.spec.run_timeout_seconds is not None:
        options.setdefault("timeoutSeconds", agent.spec.run_timeout_seconds)
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
        agent=(agent.name, agent.version),
    )
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    else:
        request.app.state.runtime.metrics.events_written.inc()  # run.created
    return accepted


@router.get("/{conversation_id}/runs", response_model=RunPage, responses=errors(404))
async def get_conversation_runs(
    request: Request,
    conversation_id: str,
    limit: int = Query(50, ge=1, le=500),
    cursor: str | None = Query(None, description="The `nextCursor` of the previous page."),
    who: Principal = CurrentPrincipal,
) -> dict[str, Any]:
    """List the conversation's runs, newest first, a page at a time."""
    pool = request.app.state.pool
    rows, next_cursor = await runs_page(pool, who, conversation_id, cursor, limit)
    return {"runs": [run_view(r) for r in rows], "nextCursor": next_cursor}


@router.get("/{conversation_id}/messages", response_model=MessageList, responses=errors(404))
async def get_conversation_messages(
    request: Request, conversation_id: str, who: Principal = CurrentPrincipal
) -> dict[str, Any]:
    """List the conversation's stored messages in order."""
    rows = await list_messages(request.app.state.pool, who, conversation_id)
    return {"messages": [message_view(r) for r in rows]}
