"""The run event vocabulary: every event type and the shape of its payload (docs/events.md).

Nodes and tools emit events through LangGraph's custom stream (`Emit`); the server stores
them, with its own events, in the run's log. The payloads they emit carry their `event` type,
and the model layer's also the message items they supersede (`supersedes`); the server's
projector takes both keys off before storing (`STREAM_KEYS`). This module imports nothing of
ours, so that `tools`, `nodes` and `server` can all share it.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any, Literal, NotRequired, TypedDict


class EventType(StrEnum):
    """Every type of event a run's log can hold."""

    RUN_CREATED = "run.created"
    RUN_STARTED = "run.started"
    RUN_REQUEUED = "run.requeued"
    RUN_PAUSED = "run.paused"
    RUN_RESUMED = "run.resumed"
    RUN_COMPLETED = "run.completed"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"
    MESSAGE_ITEM_CREATED = "message.item.created"
    MESSAGE_ITEM_DELTA = "message.item.delta"
    MESSAGE_ITEM_COMPLETED = "message.item.completed"
    TOOL_STARTED = "tool.started"
    TOOL_RETRYING = "tool.retrying"
    TOOL_COMPLETED = "tool.completed"
    TOOL_FAILED = "tool.failed"
    TOOLS_UNAVAILABLE = "tools.unavailable"
    APPROVAL_REQUIRED = "approval.required"
    APPROVAL_RESOLVED = "approval.resolved"
    USAGE = "usage"
    MODEL_RETRY = "model.retry"
    MODEL_FALLBACK = "model.fallback"
    CONTEXT_BUILT = "context.built"
    MEMORY_UPDATED = "memory.updated"
    ARTIFACT_CREATED = "artifact.created"
    ARTIFACT_UPDATED = "artifact.updated"
    PLAN_UPDATED = "plan.updated"
    SKILL_LOADED = "skill.loaded"
    SUBAGENT_STARTED = "subagent.started"
    SUBAGENT_COMPLETED = "subagent.completed"
    GRAPH_CHUNK = "graph.chunk"
    GRAPH_INTERRUPTED = "graph.interrupted"
    RETRIEVAL_COMPLETED = "retrieval.completed"


E = EventType
# Keys of a custom stream event that say how to store it; they are not stored.
STREAM_KEYS = frozenset({"event", "supersedes"})
# Exactly one of these ends every run's log.
TERMINAL_EVENTS: frozenset[EventType] = frozenset({E.RUN_COMPLETED, E.RUN_FAILED, E.RUN_CANCELLED})


class RunCreated(TypedDict):
    """`run.created`: the run is queued for the conversation's input message."""

    conversationId: str
    model: str
    modelSource: str
    agent: str
    inputMessageId: str


class RunStarted(TypedDict):
    """`run.started`: a worker claimed the run for one attempt."""

    attempt: int
    worker: str
    traceId: str


class RunRequeued(TypedDict):
    """`run.requeued`: the attempt ended without an outcome; the run waits for a worker."""

    reason: str
    recoveries: NotRequired[int]


# `from` is a Python keyword, hence the functional form.
RunPaused = TypedDict("RunPaused", {"reason": str, "from": str, "by": NotRequired[str]})


class RunResumed(TypedDict):
    """`run.resumed`: an operator resumed a paused run."""

    by: str


class RunCompleted(TypedDict):
    """`run.completed`: the run's answer, stored as the assistant message."""

    outputMessageId: str
    output: str


class RunFailed(TypedDict):
    """`run.failed`: why the run failed; model failures and budgets add their details."""

    errorType: str
    message: str
    errorClass: NotRequired[str]
    provider: NotRequired[str | None]
    model: NotRequired[str]
    attempts: NotRequired[int]
    statusCode: NotRequired[int | None]
    tried: NotRequired[list[dict[str, Any]]]
    limit: NotRequired[str]
    allowed: NotRequired[str]
    used: NotRequired[str]


class RunCancelled(TypedDict):
    """`run.cancelled`: the run was cancelled (`by` when the API cancelled it at once)."""

    reason: str
    by: NotRequired[str]


class MessageItemCreated(TypedDict):
    """`message.item.created`: an assistant message starts streaming."""

    itemId: str
    role: str
    node: str | None


class MessageItemDelta(TypedDict):
    """`message.item.delta`: the new text of a streaming item."""

    itemId: str
    delta: str


class ToolCallRef(TypedDict):
    """A tool call an answer asked for."""

    id: str | None
    name: str


class MessageItemCompleted(TypedDict):
    """`message.item.completed`: an item is closed, with its full text and status."""

    itemId: str
    status: Literal["completed", "superseded", "interrupted"]
    text: NotRequired[str]
    reason: NotRequired[str]
    toolCalls: NotRequired[list[ToolCallRef]]
    model: NotRequired[str | None]
    finishReason: NotRequired[str | None]
    reasoning: NotRequired[str]


class ToolStarted(TypedDict):
    """`tool.started`: a tool call begins (or is replayed, or refused and will not run)."""

    event: Literal[EventType.TOOL_STARTED]
    toolCallId: str
    name: str
    args: Any
    risk: str | None
    source: str | None
    attempt: NotRequired[int]
    refused: NotRequired[bool]
    replayed: NotRequired[bool]


class ToolRetrying(TypedDict):
    """`tool.retrying`: an attempt of a tool call failed and will be retried."""

    event: Literal[EventType.TOOL_RETRYING]
    toolCallId: str
    name: str
    attempt: int
    errorType: str
    error: str
    delayMs: float


class ToolFinished(TypedDict):
    """What `tool.completed` and `tool.failed` both say."""

    toolCallId: str
    name: str
    durationMs: float
    attempts: int
    replayed: bool
    outcome: str


class ToolCompleted(ToolFinished):
    """`tool.completed`: the call's output, cut to the event's budget."""

    event: Literal[EventType.TOOL_COMPLETED]
    output: str
    outputChars: int
    truncated: bool


class ToolFailed(ToolFinished):
    """`tool.failed`: the call's error as the model reads it."""

    event: Literal[EventType.TOOL_FAILED]
    errorType: str | None
    retryable: bool
    error: str


class ToolsUnavailable(TypedDict):
    """`tools.unavailable`: a tool source (an MCP server) could not be reached."""

    source: str
    reason: str


class ApprovalRequired(TypedDict):
    """`approval.required`: a tool call waits for a reviewer."""

    approvalId: str
    kind: str
    toolCallId: str
    name: str
    args: Any
    risk: str | None
    source: str | None
    reason: str
    expiresAt: str | None


class ApprovalResolved(TypedDict):
    """`approval.resolved`: a reviewer (or the expiry) decided an approval."""

    approvalId: str
    kind: str
    toolCallId: str
    name: str
    status: str
    decision: str | None
    by: str
    reason: str | None
    args: Any
    decidedAt: str | None


class ModelCall(TypedDict):
    """One model attempt as the usage ledger records it (money as a decimal string)."""

    callId: str
    step: int
    attempt: int
    modelId: str
    provider: str
    model: str
    requestedModel: str
    fallbackIndex: int
    status: Literal["ok", "failed"]
    latencyMs: float
    ttftMs: float | None
    itemId: str | None
    finishReason: str | None
    inputTokens: int | None
    outputTokens: int | None
    cachedInputTokens: int | None
    reasoningTokens: int | None
    totalTokens: int | None
    cost: str | None
    priceSource: str | None
    errorClass: str | None
    statusCode: int | None
    error: str | None


class Usage(TypedDict):
    """`usage`: one model attempt and the run's new totals (docs/usage.md)."""

    event: Literal[EventType.USAGE]
    call: ModelCall
    totals: dict[str, Any]
    purpose: NotRequired[str]


class ModelRetry(TypedDict):
    """`model.retry`: an attempt failed and the same model is tried again after `delayS`."""

    event: Literal[EventType.MODEL_RETRY]
    supersedes: list[str]
    model: str
    attempt: int
    errorClass: str
    statusCode: int | None
    delayS: float


class ModelFallback(TypedDict):
    """`model.fallback`: the next model of the fallback list is tried."""

    event: Literal[EventType.MODEL_FALLBACK]
    supersedes: list[str]
    fromModel: str
    toModel: str
    errorClass: str
    statusCode: int | None


class ContextBuilt(TypedDict):
    """`context.built`: the manifest of the next model call's input (docs/context.md)."""

    event: Literal[EventType.CONTEXT_BUILT]
    step: int
    attempt: int
    model: str
    tokenizer: str
    profile: dict[str, Any]
    window: int
    reserveOutputTokens: int
    toolsTokens: int
    available: int
    totalTokens: int
    messages: int
    conversationMessages: int
    sections: list[dict[str, Any]]
    dropped: list[dict[str, Any]]
    cut: list[dict[str, Any]]
    deduplicated: list[dict[str, Any]]
    summary: dict[str, Any] | None
    tools: list[str]


class MemoryUpdated(TypedDict):
    """`memory.updated`: what a run's memory extraction added, updated and removed."""

    jobId: str
    model: str | None
    added: list[dict[str, Any]]
    updated: list[dict[str, Any]]
    removed: list[dict[str, Any]]
    counts: dict[str, int]


class ArtifactWritten(TypedDict):
    """`artifact.created` (first version) or `artifact.updated` (a later one); docs/artifacts.md."""

    event: Literal[EventType.ARTIFACT_CREATED, EventType.ARTIFACT_UPDATED]
    artifactId: str
    name: str
    version: int
    mediaType: str
    size: int
    checksum: str
    link: str
    toolCallId: str
    replayed: bool


class PlanUpdated(TypedDict):
    """`plan.updated`: the run's whole plan after a change, and what changed."""

    event: Literal[EventType.PLAN_UPDATED]
    plan: dict[str, Any]
    changed: list[dict[str, Any]]
    reason: str
    toolCallIds: NotRequired[list[str]]


class SkillLoaded(TypedDict):
    """`skill.loaded`: the run loaded (and pinned) one exact version of a skill."""

    event: Literal[EventType.SKILL_LOADED]
    name: str
    version: int
    label: str
    hash: str
    owner: str
    allowedTools: list[str] | None
    resources: list[str]
    via: str
    toolCallId: str | None
    similarity: NotRequired[float]


class SubagentStarted(TypedDict):
    """`subagent.started`: a `delegate` call started a child run; the parent waits for it."""

    toolCallId: str
    childRunId: str
    agent: str
    task: str
    replayed: NotRequired[bool]


class SubagentCompleted(TypedDict):
    """`subagent.completed`: a delegation ended (or was refused); what the parent is handed."""

    toolCallId: str
    childRunId: str | None
    agent: str
    status: str
    summary: str
    error: str | None
    usage: dict[str, Any]


class RetrievalCompleted(TypedDict):
    """`retrieval.completed`: one knowledge retrieval's evidence record (docs/knowledge.md)."""

    retrievalId: str
    mode: str
    query: str
    rewrittenQuery: str | None
    knowledgeBases: list[str]
    denied: list[str]
    topK: int
    reranked: bool
    chunks: list[dict[str, Any]]
    used: list[str]
    step: int | None
    toolCallId: str | None


# The payload of each event type; docs/events.md documents these fields (checked by a test).
class GraphChunk(TypedDict):
    """`graph.chunk`: one part of a LangGraph stream of a run started through its API."""

    mode: str
    ns: str
    data: Any


class GraphInterrupted(TypedDict):
    """`graph.interrupted`: the graph stopped on these interrupts; the run ends with them."""

    interrupts: list[dict[str, Any]]


PAYLOADS: dict[EventType, type] = {
    E.RUN_CREATED: RunCreated,
    E.RUN_STARTED: RunStarted,
    E.RUN_REQUEUED: RunRequeued,
    E.RUN_PAUSED: RunPaused,
    E.RUN_RESUMED: RunResumed,
    E.RUN_COMPLETED: RunCompleted,
    E.RUN_FAILED: RunFailed,
    E.RUN_CANCELLED: RunCancelled,
    E.MESSAGE_ITEM_CREATED: MessageItemCreated,
    E.MESSAGE_ITEM_DELTA: MessageItemDelta,
    E.MESSAGE_ITEM_COMPLETED: MessageItemCompleted,
    E.TOOL_STARTED: ToolStarted,
    E.TOOL_RETRYING: ToolRetrying,
    E.TOOL_COMPLETED: ToolCompleted,
    E.TOOL_FAILED: ToolFailed,
    E.TOOLS_UNAVAILABLE: ToolsUnavailable,
    E.APPROVAL_REQUIRED: ApprovalRequired,
    E.APPROVAL_RESOLVED: ApprovalResolved,
    E.USAGE: Usage,
    E.MODEL_RETRY: ModelRetry,
    E.MODEL_FALLBACK: ModelFallback,
    E.CONTEXT_BUILT: ContextBuilt,
    E.MEMORY_UPDATED: MemoryUpdated,
    E.ARTIFACT_CREATED: ArtifactWritten,
    E.ARTIFACT_UPDATED: ArtifactWritten,
    E.PLAN_UPDATED: PlanUpdated,
    E.SKILL_LOADED: SkillLoaded,
    E.SUBAGENT_STARTED: SubagentStarted,
    E.SUBAGENT_COMPLETED: SubagentCompleted,
    E.GRAPH_CHUNK: GraphChunk,
    E.GRAPH_INTERRUPTED: GraphInterrupted,
    E.RETRIEVAL_COMPLETED: RetrievalCompleted,
}


# What nodes and tools write to LangGraph's custom stream.
StreamEvent = (
    ToolStarted
    | ToolRetrying
    | ToolCompleted
    | ToolFailed
    | Usage
    | ModelRetry
    | ModelFallback
    | ContextBuilt
    | ArtifactWritten
    | PlanUpdated
    | SkillLoaded
    | RetrievalCompleted
)
# How nodes and tools emit an event: LangGraph's stream writer (`runtime.stream_writer`).
Emit = Callable[[StreamEvent], None]
