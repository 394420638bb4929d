"""Every error the server raises on purpose, each carrying its HTTP status and code.

This module imports nothing of ours and no framework, so every layer (and the `agentrt`
command, which must start fast) can raise these. `server/routes/errors.py` answers them all
with one handler as `{"error": {"code", "message", ...}}`.
"""

from __future__ import annotations

from typing import ClassVar


class AgentrtError(Exception):
    """An error of ours: the HTTP status and code it is answered with, and its message.

    Attributes:
        status: The HTTP status of the answer; 5xx errors are answered without their message,
            which may describe internals.
        code: The stable machine-readable code of the answer, e.g. `not_found`.
        retry_after_s: When set, the answer carries `Retry-After` with this many seconds.
        message: What went wrong and what to do about it, for a person.
        fields: Members the JSON error carries beside `code` and `message` (e.g. `runId`).
    """

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"
    retry_after_s: ClassVar[int | None] = None

    def __init__(self, message: str, **fields: str) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields


class StartupError(AgentrtError):
    """A start-up check failed; the message names the problem and the fix."""

    code = "startup_failed"


class AgentFileError(AgentrtError):
    """An agent profile file cannot be read or is not a valid profile (refuses the start)."""

    code = "agent_file_invalid"


class LeaseLostError(AgentrtError):
    """Another worker took the run over; this one must stop writing for it."""

    code = "lease_lost"


class JobLeaseLostError(LeaseLostError):
    """Another worker took a background job over; this one must write nothing more for it."""

    code = "job_lease_lost"


class MemoryConfigError(StartupError):
    """The embedding settings cannot work; the message names the fix (refuses the start)."""

    code = "memory_config"


class RunTimeoutError(AgentrtError):
    """The run passed its wall-clock deadline; it fails with the reason `timeout`."""

    code = "timeout"


class BadRequestError(AgentrtError):
    """The request cannot be understood as sent."""

    status = 400
    code = "bad_request"


class UnknownModelError(BadRequestError):
    """The model id names no provider or model this server can use."""

    code = "unknown_model"


class InvalidIdempotencyKeyError(BadRequestError):
    """The `Idempotency-Key` header value cannot be a key."""

    code = "invalid_idempotency_key"


class UnauthorizedError(AgentrtError):
    """The API key is missing, unknown or revoked."""

    status = 401
    code = "unauthorized"


class ForbiddenError(AgentrtError):
    """The caller's roles do not allow this."""

    status = 403
    code = "forbidden"


class RunForbiddenError(ForbiddenError):
    """The caller may not control this run (it is neither its owner nor a tenant admin)."""


class ApprovalForbiddenError(ForbiddenError):
    """The caller may not see or decide approvals (needs the reviewer role)."""


class AgentForbiddenError(ForbiddenError):
    """Changing agent profiles needs the tenant's admin role."""


class MemoryForbiddenError(ForbiddenError):
    """The caller may not see or change these memories (another user's, or the tenant's)."""


class NotFoundError(AgentrtError):
    """No such resource for the caller's tenant."""

    status = 404
    code = "not_found"


class RunNotFoundError(NotFoundError):
    """The run does not exist (or belongs to another tenant)."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id} not found")
        self.run_id = run_id


class ConversationNotFoundError(NotFoundError):
    """No such conversation for this tenant."""

    def __init__(self, conversation_id: str) -> None:
        super().__init__(f"conversation {conversation_id} not found")
        self.conversation_id = conversation_id


class ApprovalNotFoundError(NotFoundError):
    """No such approval in the caller's tenant."""

    def __init__(self, approval_id: str) -> None:
        super().__init__(f"approval {approval_id} not found")
        self.approval_id = approval_id


class AgentNotFoundError(NotFoundError):
    """No such agent profile (or version) for the caller's tenant."""

    code = "agent_not_found"

    def __init__(self, name: str, version: int | None = None) -> None:
        what = f"agent {name!r}" if version is None else f"version {version} of agent {name!r}"
        super().__init__(
            f"{what} does not exist for your tenant; `GET /api/agents` (or `agentrt agents "
            "list`) lists the agents you can use"
        )


class MemoryNotFoundError(NotFoundError):
    """No such memory for the user or the tenant."""

    code = "memory_not_found"


class ConflictError(AgentrtError):
    """The request conflicts with the resource's state."""

    status = 409
    code = "conflict"


class RunFinishedError(ConflictError):
    """The run already reached a terminal status; nothing more may be appended."""

    code = "run_finished"

    def __init__(self, run_id: str, status: str) -> None:
        super().__init__(f"run {run_id} is already {status}", runStatus=status)
        self.run_status = status


class IllegalTransitionError(ConflictError):
    """A status change the run state machine does not allow."""

    code = "illegal_transition"

    def __init__(self, current: str, target: str) -> None:
        super().__init__(f"a run cannot go from {current} to {target}")
        self.current = current
        self.target = target


class ConversationBusyError(ConflictError):
    """The conversation has a run in progress and the policy is `reject`."""

    code = "conversation_busy"

    def __init__(self, conversation_id: str, run_id: str, status: str) -> None:
        super().__init__(
            f"conversation {conversation_id} has run {run_id} in progress ({status}); wait for "
            "it, cancel it, or send again with ifBusy 'enqueue' or 'interrupt'",
            runId=run_id,
        )
        self.run_id = run_id


class RunNotPausedError(ConflictError):
    """Resume was asked of a run that is not paused."""

    code = "not_paused"

    def __init__(self, run_id: str, status: str, pause_requested: bool) -> None:
        if pause_requested:
            message = (
                f"run {run_id} is still {status}: its pause takes effect at its next step, "
                "so resume it once its status is paused"
            )
        else:
            message = f"run {run_id} is {status}, not paused: only a paused run can be resumed"
        super().__init__(message, runStatus=status)


class ApprovalDecidedError(ConflictError):
    """The approval was already decided (or expired, or its run was cancelled)."""

    code = "already_decided"

    def __init__(self, approval_id: str, status: str) -> None:
        super().__init__(f"approval {approval_id} is already {status}", approvalStatus=status)


class AgentExistsError(ConflictError):
    """Creating an agent profile whose name is taken."""

    code = "agent_exists"

    def __init__(self, name: str) -> None:
        super().__init__(
            f"agent {name!r} already exists; update it with PUT /api/agents/{name} (a new "
            "version) or pick another name"
        )


class AgentReadOnlyError(ConflictError):
    """Changing an agent profile declared in a file (it lives in version control)."""

    code = "agent_read_only"


class InvalidRequestError(AgentrtError):
    """The request is well formed but its content is refused; the message says why."""

    status = 422
    code = "invalid_request"


class IdempotencyKeyReusedError(InvalidRequestError):
    """The key was already used for a request with a different body."""

    code = "idempotency_key_reused"

    def __init__(self, key: str, run_id: str) -> None:
        super().__init__(
            f"Idempotency-Key {key!r} was already used for a different request (it created run "
            f"{run_id}); send a new key for a new message, or the same body to retry",
            runId=run_id,
        )
        self.run_id = run_id


class BadCursorError(InvalidRequestError):
    """The cursor is not one this listing returned (or its row is gone)."""

    code = "invalid_cursor"

    def __init__(self, cursor: str) -> None:
        super().__init__(
            f"cursor {cursor!r} is not a cursor this listing returned; pass the 'nextCursor' "
            "of the previous page, or leave it out for the first page"
        )


class ToolConfigError(InvalidRequestError):
    """A tenant tool config the API refuses (the message says why)."""

    code = "invalid_tool_config"


class UnknownAgentError(InvalidRequestError):
    """A message or conversation names an agent profile the tenant does not have."""

    code = "unknown_agent"


class BadAgentReferenceError(UnknownAgentError):
    """The text naming an agent is not `name` or `name@version`."""


class InvalidMemoryError(InvalidRequestError):
    """A memory's text, kind or expiry is refused; the message says why."""

    code = "invalid_memory"


class TooLargeError(AgentrtError):
    """The request body, or a part of it, is over its size limit."""

    status = 413
    code = "too_large"


class TooManyRunsError(AgentrtError):
    """The user has as many runs in progress as the limit allows (policy `reject`)."""

    status = 429
    code = "too_many_runs"
    retry_after_s = 5

    def __init__(self, limit: int, count: int) -> None:
        super().__init__(
            f"you have {count} runs queued or running; the limit is {limit}. Wait for one to "
            "finish or cancel one"
        )


class MemoryUnavailableError(AgentrtError):
    """This process runs without a memory store."""

    status = 503
    code = "memory_unavailable"


class ArtifactNotFoundError(NotFoundError):
    """No such artifact (or version) in the caller's tenant."""

    code = "artifact_not_found"


class ArtifactTooLargeError(TooLargeError):
    """An artifact's content is over the size limit (`AGENTRT_ARTIFACT_MAX_BYTES`)."""


class RangeNotSatisfiableError(AgentrtError):
    """A `Range` header asks for bytes the artifact does not have."""

    status = 416
    code = "range_not_satisfiable"


class SkillNotFoundError(NotFoundError):
    """No such skill (or version) for the caller's tenant."""

    code = "skill_not_found"


class InvalidSkillError(InvalidRequestError):
    """An uploaded skill does not follow the SKILL.md format; the message says what to fix."""

    code = "invalid_skill"


class SkillForbiddenError(ForbiddenError):
    """Uploading, enabling or disabling skills needs the tenant's admin role."""


class RunNotRetryableError(ConflictError):
    """Retry was asked of a run that cannot be retried (the message says why)."""

    code = "not_retryable"

    def __init__(self, run_id: str, reason: str) -> None:
        super().__init__(f"run {run_id} cannot be retried: {reason}", runId=run_id)


class EventsExpiredError(AgentrtError):
    """The run's event log was dropped by the retention; its record and snapshot remain."""

    status = 410
    code = "events_expired"

    def __init__(self, run_id: str, expired_at: str) -> None:
        super().__init__(
            f"the event log of run {run_id} expired on {expired_at} under the retention "
            f"policy; GET /api/runs/{run_id}/snapshot still answers with its final state",
            runId=run_id,
        )


class RunsActiveError(ConflictError):
    """An erasure refused while runs of what it would erase are in progress."""

    code = "runs_active"

    def __init__(self, what: str, run_ids: list[str], cancelling: bool) -> None:
        shown = ", ".join(run_ids[:5]) + (" …" if len(run_ids) > 5 else "")
        hint = (
            "their cancellation was requested; retry once they have ended"
            if cancelling
            else "cancel them first, or retry with ?cancel=true"
        )
        super().__init__(
            f"{what} has runs in progress ({shown}): {hint}", runIds=",".join(run_ids[:20])
        )


class AssistantNotFoundError(NotFoundError):
    """No assistant (or graph) of the LangGraph API has this id."""

    def __init__(self, assistant_id: str) -> None:
        super().__init__(
            f"assistant {assistant_id} not found; use a graph id of langgraph.json or an"
            " assistant id from POST /assistants/search"
        )


class ThreadNotFoundError(NotFoundError):
    """No thread of the caller has this id."""

    def __init__(self, thread_id: str) -> None:
        super().__init__(f"thread {thread_id} not found; create it with POST /threads")


class LangGraphItemNotFoundError(NotFoundError):
    """A run, checkpoint or store item the LangGraph API asked for does not exist."""


class ThreadExistsError(ConflictError):
    """A thread with this id exists and `if_exists` is `raise`."""

    code = "thread_exists"

    def __init__(self, thread_id: str) -> None:
        super().__init__(
            f"thread {thread_id} already exists; send if_exists 'do_nothing' to get it instead"
        )


class ThreadBusyError(ConflictError):
    """The thread has a run in progress and `multitask_strategy` is `reject`."""

    code = "thread_busy"

    def __init__(self, thread_id: str, run_id: str) -> None:
        super().__init__(
            f"Thread is already running a task: thread {thread_id} has run {run_id} in"
            " progress; wait for it, or send multitask_strategy 'enqueue', 'interrupt' or"
            " 'rollback'",
            runId=run_id,
        )


class UnknownGraphError(InvalidRequestError):
    """The run names a graph this server did not load from langgraph.json."""

    code = "unknown_graph"

    def __init__(self, graph_id: str) -> None:
        super().__init__(
            f"graph {graph_id!r} is not loaded; list it under `graphs` in langgraph.json"
            " (AGENTRT_LANGGRAPH_CONFIG) and restart"
        )


class InvalidGraphRequestError(InvalidRequestError):
    """A LangGraph API request is well-formed JSON but asks for something impossible."""

    code = "invalid_graph_request"


class UnknownReferenceError(InvalidRequestError):
    """The body names something the path's resource does not have (a checkpoint, a version).

    The path's resource exists, so the answer is 422, not 404: a 404 says the path itself
    names nothing, which a client would read as "the thread (or assistant, or skill) is gone".
    """

    code = "unknown_reference"


class AssistantExistsError(ConflictError):
    """An assistant with this id exists and `if_exists` is `raise`."""

    code = "assistant_exists"

    def __init__(self, assistant_id: str) -> None:
        super().__init__(
            f"assistant {assistant_id} already exists; send if_exists 'do_nothing' to get it"
        )


class AssistantReadOnlyError(ConflictError):
    """A graph's default assistant cannot be changed or deleted."""

    code = "assistant_read_only"

    def __init__(self, assistant_id: str) -> None:
        super().__init__(
            f"assistant {assistant_id} is its graph's default and cannot change; create an"
            " assistant of the graph (POST /assistants) and change that one"
        )


class KnowledgeForbiddenError(ForbiddenError):
    """The caller's roles do not allow this on knowledge bases (the message names the role)."""


class KnowledgeBaseNotFoundError(NotFoundError):
    """No such knowledge base for the caller (another tenant's, or one their roles hide)."""

    code = "knowledge_base_not_found"

    def __init__(self, ref: str) -> None:
        super().__init__(
            f"knowledge base {ref!r} not found; `GET /api/knowledge-bases` lists yours"
        )


class DocumentNotFoundError(NotFoundError):
    """No such document in the knowledge base."""

    code = "document_not_found"

    def __init__(self, document_id: str) -> None:
        super().__init__(f"document {document_id} not found in this knowledge base")


class KnowledgeBaseExistsError(ConflictError):
    """The tenant already has a knowledge base of this name."""

    code = "knowledge_base_exists"

    def __init__(self, name: str) -> None:
        super().__init__(
            f"a knowledge base named {name!r} exists already; pick another name or delete it"
        )


class InvalidDocumentError(InvalidRequestError):
    """A document the API cannot take: its type, size, or URL (the message says why)."""

    code = "invalid_document"


class InvalidKnowledgeBaseError(InvalidRequestError):
    """A knowledge base's settings are refused (embedding model, chunking)."""

    code = "invalid_knowledge_base"


class UrlNotAllowedError(InvalidRequestError):
    """A document URL whose host is not in AGENTRT_KNOWLEDGE_URL_ALLOWLIST."""

    code = "url_not_allowed"
