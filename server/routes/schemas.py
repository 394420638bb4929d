"""Response models of the HTTP API and the error shape every non-2xx answer has.

Routes build plain dicts with camelCase keys; these models validate and document them, so
`/openapi.json` describes every body a client can receive. Models allow extra keys so that
a field added to a view is never silently dropped from a response.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from server.domain import RunStatus


class ApiModel(BaseModel):
    """Base of the response models: camelCase on the wire, extra keys kept."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


class ErrorDetail(ApiModel):
    """What went wrong, for a person (`message`) and for code (`code`)."""

    code: str = Field(description="Stable machine-readable code, e.g. `not_found`.")
    message: str = Field(description="What was wrong and what to do about it.")


class ErrorBody(ApiModel):
    """The body of every error response. Some codes add fields (e.g. `runId`)."""

    error: ErrorDetail


_STATUS_TEXT = {
    400: "Malformed request: invalid JSON, unknown model, or a bad header.",
    401: "Missing, unknown or revoked API key.",
    403: "The caller's roles do not allow this.",
    404: "No such resource for the caller's tenant.",
    409: "Conflicts with the resource's state (finished run, busy conversation, decided).",
    413: "The request body, or a part of it, is over its size limit.",
    422: "The request failed validation; `message` names each bad field.",
    429: "Too many runs in progress; retry after `Retry-After` seconds.",
    500: "Unexpected server error; `message` carries a request id for the logs.",
    503: "The database is unavailable (or the server is not ready); retry after `Retry-After`.",
    410: "Gone: the run's event log expired under the retention policy (its snapshot remains).",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """Declare the error responses a route or router can answer, all with `ErrorBody`."""
    return {s: {"model": ErrorBody, "description": _STATUS_TEXT[s]} for s in statuses}


def errors_as_json(openapi: dict[str, Any]) -> dict[str, Any]:
    """Document every error body as `application/json`, the type every error is sent as.

    FastAPI files a declared response's model under the route's own media type, so the
    errors of a stream or a file route would read as `text/event-stream` or `text/plain`.
    """
    for operations in openapi.get("paths", {}).values():
        for operation in operations.values():
            for status, response in operation.get("responses", {}).items():
                content = response.get("content")
                if status[:1] in "45" and content and "application/json" not in content:
                    response["content"] = {"application/json": next(iter(content.values()))}
    return openapi


# Every authenticated route: bad key, bad query or path parameter, unexpected fault.
COMMON_ERRORS = errors(401, 422, 500, 503)
# Routes that take a JSON body.
BODY_ERRORS = errors(400, 413, 422)


class Conversation(ApiModel):
    """A conversation: a LangGraph thread that runs append to."""

    conversation_id: str
    title: str | None
    model: str | None
    agent: str | None = Field(None, description="The agent profile its runs use by default.")
    metadata: dict[str, Any]
    user_id: str
    created_at: str | None


class ConversationPage(ApiModel):
    """A page of conversations, newest first."""

    conversations: list[Conversation]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null on the last page."
    )


class Message(ApiModel):
    """A stored user or assistant message."""

    message_id: str
    conversation_id: str
    run_id: str | None
    role: str
    content: str
    created_at: str | None


class MessageList(ApiModel):
    """A conversation's messages in order."""

    messages: list[Message]


class RunError(ApiModel):
    """Why a run failed (`type`, `message`, plus details of the error type)."""

    type: str
    message: str | None


class AgentRef(ApiModel):
    """The exact agent profile version a run uses (version 0: the built-in default)."""

    name: str
    version: int


class Run(ApiModel):
    """The run record."""

    run_id: str
    conversation_id: str
    user_id: str
    status: RunStatus
    model: str
    agent: AgentRef
    options: dict[str, Any]
    input_message_id: str | None
    output_message_id: str | None
    attempt: int
    error: RunError | None
    last_event_id: int = Field(description="Seq of the run's last event (SSE cursor).")
    usage: dict[str, Any] | None
    cancel_requested: bool
    pause_requested: bool = Field(description="A pause was asked for and has not taken effect.")
    paused_at: str | None = Field(None, description="When the run was paused; null if not paused.")
    lease_owner: str | None
    recoveries: int
    created_at: str | None
    started_at: str | None
    finished_at: str | None
    parent_run_id: str | None = Field(None, description="The run that delegated to this one.")
    depth: int = Field(0, description="How deep below a user's run (0: started by a user).")
    not_before: str | None = Field(None, description="A delayed run is not started before this.")


class CancelledRun(Run):
    """The run record after a cancel request."""

    cancelled: bool = Field(description="True if the run ended now; else its worker stops it.")


class PausedRun(Run):
    """The run record after a pause request."""

    paused: bool = Field(description="True if the run paused now; else at its next step.")


class RunPage(ApiModel):
    """A page of runs, newest first."""

    runs: list[Run]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null on the last page."
    )


class RunAccepted(ApiModel):
    """The run queued for a posted message."""

    run_id: str
    status: RunStatus
    conversation_id: str
    message_id: str
    model: str
    model_source: str | None
    agent: AgentRef | None = None
    stream_url: str
    snapshot_url: str


class Snapshot(ApiModel):
    """What a run looks like as of `lastEventId` (see docs/events.md)."""

    run_id: str
    status: RunStatus
    last_event_id: int
    attempt: int
    items: list[dict[str, Any]]
    tool_calls: list[dict[str, Any]]
    approvals: list[dict[str, Any]]
    error: dict[str, Any] | None
    output: str = Field(description="The assistant text so far, superseded items left out.")
    children: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Child runs (subagents): toolCallId, runId, agent, task, live status.",
    )


class Decision(ApiModel):
    """How an approval was decided."""

    decision: str | None
    by: str | None
    at: str | None
    reason: str | None
    args: dict[str, Any] | None


class Approval(ApiModel):
    """A tool call waiting for, or past, a human decision (arguments redacted)."""

    approval_id: str
    run_id: str
    conversation_id: str
    kind: str
    tool_call_id: str
    tool: str
    args: dict[str, Any]
    risk: str | None
    source: str | None
    reason: str | None
    status: str
    decision: Decision | None
    requested_at: str | None
    expires_at: str | None


class ApprovalList(ApiModel):
    """Approvals in request order."""

    approvals: list[Approval]


class Tool(ApiModel):
    """A tool the tenant has, with its policy and whether the caller's runs may call it."""

    name: str
    description: str
    source: str
    risk: str
    permissions: list[str]
    idempotent: bool
    dedupes: bool
    timeout_s: float | None = Field(alias="timeoutS")
    approval_required: bool
    allowed: bool
    permitted: bool
    input_schema: dict[str, Any]


class ToolList(ApiModel):
    """The tenant's tools and the MCP servers that could not be reached."""

    tools: list[Tool]
    unavailable: list[dict[str, str]]


class ToolConfigView(ApiModel):
    """The tenant's stored overlay and the effective tool config (secrets hidden)."""

    overlay: dict[str, Any] | None
    effective: dict[str, Any]


class QueueView(ApiModel):
    """How the queue and the workers are doing: the installation's, or one tenant's."""

    scope: Literal["installation", "tenant"]
    tenant_id: str | None
    counts: dict[str, int]
    oldest_queued_age_seconds: float | None
    workers: list[dict[str, Any]]
    expired_leases: list[dict[str, Any]]


class Trace(ApiModel):
    """A run's span tree (see docs/observability.md)."""

    run_id: str
    trace_id: str
    span_count: int
    failed_span: dict[str, Any] | None
    root: dict[str, Any]


class RunUsage(ApiModel):
    """A run's usage totals, budget and model calls."""

    run_id: str
    status: RunStatus
    totals: dict[str, Any]
    budget: dict[str, Any]
    calls: list[dict[str, Any]]
    with_descendants: dict[str, Any] | None = Field(
        None, description="Totals of the run and every child run below it (`runs`: how many)."
    )


class UsageReport(ApiModel):
    """Usage and cost per UTC day."""

    tenant_id: str
    start: str = Field(alias="from")
    end: str = Field(alias="to")
    group_by: str
    user_id: str | None
    days: list[dict[str, Any]]


class ModelsView(ApiModel):
    """The configured providers, fallbacks and routing rules (never keys)."""

    default_model: str
    providers: dict[str, Any]
    fallbacks: dict[str, list[str]]
    routes: list[dict[str, Any]]


class Circuit(ApiModel):
    """One model's circuit breaker."""

    model: str
    state: str
    consecutive_failures: int
    opened_count: int
    retry_in_s: float | None = Field(alias="retryInS")


class Circuits(ApiModel):
    """Every circuit this process has seen."""

    threshold: int
    cooldown_s: float = Field(alias="cooldownS")
    circuits: list[Circuit]


class Health(ApiModel):
    """Liveness."""

    status: str


class Readiness(ApiModel):
    """Readiness and the check behind it."""

    status: str
    checks: dict[str, str]


class StoredEvent(ApiModel):
    """One event of a run's log, as the `data` line of an SSE frame carries it."""

    seq: int = Field(description="Gapless position in the run's log, from 1.")
    type: str = Field(description="Event type, e.g. `message.item.delta` (docs/events.md).")
    run_id: str
    ts: str = Field(description="When the event was stored (ISO 8601, UTC).")
    data: dict[str, Any]


def sse_frame_schema() -> dict[str, Any]:
    """The JSON schema of one SSE frame of a run's event stream (`id`, `event`, `data`)."""
    return {
        "type": "object",
        "required": ["id", "event", "data"],
        "properties": {
            "id": {"type": "string", "pattern": "^[0-9]+$", "description": "The event's seq."},
            "event": {"type": "string", "description": "The event's type."},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": StoredEvent.model_json_schema(by_alias=True),
            },
        },
    }


class Children(ApiModel):
    """A run's child runs (subagents), oldest first."""

    run_id: str
    children: list[dict[str, Any]]


STREAM_DESCRIPTION = """Server-sent events, one frame per stored event, in `seq` order:

```
id: <seq>
event: <type>
data: {"seq": <seq>, "type": "<type>", "runId": "...", "ts": "<ISO 8601>", "data": {...}}
```

Replays the events after `after` (or the `Last-Event-ID` header), then streams live ones
and closes after the run's terminal event (`run.completed`, `run.failed`, `run.cancelled`).
Comment lines (`: heartbeat`) keep idle connections open. Event types and their `data`
are listed in docs/events.md.
"""


class EventStreamResponse(StreamingResponse):
    """A `text/event-stream` response of a run's events, never cached nor buffered by proxies."""

    media_type = "text/event-stream"

    def __init__(
        self, content: Any, status_code: int = 200, headers: dict[str, str] | None = None
    ) -> None:
        fixed = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(content, status_code, headers={**fixed, **(headers or {})})


def event_stream_response(description: str = STREAM_DESCRIPTION) -> dict[str, Any]:
    """The OpenAPI entry of a `text/event-stream` answer of a run's events."""
    return {
        "description": description,
        "content": {"text/event-stream": {"schema": sse_frame_schema()}},
    }
