"""Conversations and the message that starts a run."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Header, Query, Response, status
from pydantic import BaseModel, ConfigDict, Field

from server.agents.profiles import MaxSteps
from server.deps import (
    ModelsDep,
    PoolDep,
    PrincipalDep,
    RunStreamsDep,
    ServiceDep,
    SettingsDep,
)
from server.errors import InvalidRequestError, TooLargeError
from server.routes.guards import CleanText, is_blank, metadata_problem
from server.routes.schemas import (
    BODY_ERRORS,
    COMMON_ERRORS,
    Conversation,
    ConversationPage,
    EventStreamResponse,
    MessageList,
    RunAccepted,
    RunPage,
    errors,
    event_stream_response,
)
from server.runs.conversations import create_conversation, get_conversation, list_messages
from server.runs.idempotency import HEADER as IDEMPOTENCY_HEADER
from server.runs.idempotency import MAX_KEY_CHARS, idempotency_key
from server.runs.pages import conversations_page, runs_page
from server.runs.service import NewMessage
from server.runs.views import conversation_view, message_view, run_view
from tools.jsontypes import JsonFloat, NotTextOrFlag

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


Count = Annotated[int, Field(ge=1), NotTextOrFlag]
"""A limit counted from one: steps, tokens or model calls."""


class RunOptions(BaseModel):
    """Per-run options."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    max_steps: MaxSteps | None = Field(default=None, alias="maxSteps")
    timeout_seconds: JsonFloat | None = Field(
        default=None, gt=0, le=7 * 24 * 3600, allow_inf_nan=False, alias="timeoutSeconds"
    )
    tools: list[str] | None = Field(
        default=None, description="Only these tools (of those the tenant allows) for this run."
    )
    needs: list[str] | None = Field(
        default=None, description="Capabilities the run needs (e.g. 'reasoning'), for routing."
    )
    max_tokens: Count | None = Field(default=None, alias="maxTokens")
    max_cost: Decimal | None = Field(default=None, ge=0, allow_inf_nan=False, alias="maxCost")
    max_model_calls: Count | None = Field(default=None, alias="maxModelCalls")


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
    pool: PoolDep,
    settings: SettingsDep,
    models: ModelsDep,
    service: ServiceDep,
    who: PrincipalDep,
    body: Annotated[ConversationIn | None, CleanText, Body()] = None,
) -> dict[str, Any]:
    """Create a conversation (a LangGraph thread)."""
    body = body or ConversationIn()
    problem = metadata_problem(body.metadata, settings.max_metadata_bytes)
    if problem is not None:
        raise InvalidRequestError(problem)
    if body.model is not None:
        models.validate(body.model)
    row = await create_conversation(pool, who, body.title, body.model, body.metadata, body.agent)
    service.met_conversation(who, row)  # its first message can go in one round trip
    return conversation_view(row)


@router.get("", response_model=ConversationPage)
async def get_conversations(
    pool: PoolDep,
    who: PrincipalDep,
    limit: int = Query(50, ge=1, le=500),
    cursor: str | None = Query(None, description="The `nextCursor` of the previous page."),
) -> dict[str, Any]:
    """List the tenant's conversations, newest first, a page at a time."""
    rows, next_cursor = await conversations_page(pool, who, cursor, limit)
    return {"conversations": [conversation_view(r) for r in rows], "nextCursor": next_cursor}


@router.get("/{conversation_id}", response_model=Conversation, responses=errors(404))
async def get_conversation_route(
    conversation_id: str, pool: PoolDep, who: PrincipalDep
) -> dict[str, Any]:
    """Return one conversation."""
    async with pool.connection() as conn:
        return conversation_view(await get_conversation(conn, who, conversation_id))


_STREAMED = """With `stream=true`: the new run's events as server-sent events, from its first
(`run.created`) to its terminal event, in one response; `X-Run-Id` names the run. A client
that loses the connection resumes with `GET /api/runs/{runId}/events` and `Last-Event-ID`.
Frames as in `GET /api/runs/{run_id}/events`.
"""


@router.post(
    "/{conversation_id}/messages",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=RunAccepted,
    responses={200: event_stream_response(_STREAMED), **BODY_ERRORS, **errors(404, 409, 429)},
)
async def post_message(
    response: Response,
    conversation_id: str,
    body: Annotated[MessageIn, CleanText],
    settings: SettingsDep,
    service: ServiceDep,
    streams: RunStreamsDep,
    who: PrincipalDep,
    stream: bool = Query(
        False,
        description="Answer 200 with the run's event stream instead of 202 with its record "
        "(one request from the message to the answer's last token).",
    ),
    key: Annotated[
        str | None,
        Header(
            alias=IDEMPOTENCY_HEADER,
            description="A unique string of 1 to 255 printable ASCII characters (a UUID). A "
            "retry with the same key and body returns the first answer and creates nothing; "
            "with another body it is refused (422).",
            # Checked by the route, whose 400 names the rule; the schema says it too.
            json_schema_extra={"pattern": "^[ -~]*[!-~][ -~]*$", "maxLength": MAX_KEY_CHARS},
        ),
    ] = None,
) -> dict[str, Any] | EventStreamResponse:
    """Store a user message and queue a run for it; answers at once, or streams the run."""
    if is_blank(body.content):
        raise InvalidRequestError(
            "content must not be empty (it has only spaces or invisible characters)"
        )
    if len(body.content) > settings.max_message_chars:
        raise TooLargeError(
            f"content has {len(body.content)} characters; the limit is "
            f"{settings.max_message_chars} (AGENTRT_MAX_MESSAGE_CHARS)",
        )
    message = NewMessage(
        conversation_id=conversation_id,
        content=body.content,
        model=body.model,
        agent=body.agent,
        options=body.options.model_dump(by_alias=True, exclude_none=True, mode="json"),
        needs=body.options.needs or [],
        if_busy=body.if_busy,
        idempotency=idempotency_key(key, body.model_dump(by_alias=True, mode="json")),
    )
    accepted = await service.post_message(who, message)
    replay = {"Idempotent-Replayed": "true"} if accepted.replayed else {}
    if stream:
        run_id = accepted.answer["runId"]
        return EventStreamResponse(
            streams.open(run_id, 0, committed=accepted.created),
            headers={"X-Run-Id": run_id, **replay},
        )
    response.headers.update(replay)
    return accepted.answer


@router.get("/{conversation_id}/runs", response_model=RunPage, responses=errors(404))
async def get_conversation_runs(
    conversation_id: str,
    pool: PoolDep,
    who: PrincipalDep,
    limit: int = Query(50, ge=1, le=500),
    cursor: str | None = Query(None, description="The `nextCursor` of the previous page."),
) -> dict[str, Any]:
    """List the conversation's runs, newest first, a page at a time."""
    rows, next_cursor = await runs_page(pool, who, conversation_id, cursor, limit)
    return {"runs": [run_view(r) for r in rows], "nextCursor": next_cursor}


@router.get("/{conversation_id}/messages", response_model=MessageList, responses=errors(404))
async def get_conversation_messages(
    conversation_id: str, pool: PoolDep, who: PrincipalDep
) -> dict[str, Any]:
    """List the conversation's stored messages in order."""
    rows = await list_messages(pool, who, conversation_id)
    return {"messages": [message_view(r) for r in rows]}
