"""What the API asks of runs: accept a message, cancel, decide an approval, read a trace.

Each is one call for its route, and counts its events and records its spans here, so routes
only parse and shape answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from server.agents.profiles import DEFAULT_AGENT, parse_ref
from server.agents.store import AgentVersion, resolve_agent
from server.auth import Principal
from server.db.pool import Conn, Pool
from server.domain import Run, RunStatus
from server.errors import AgentrtError, InvalidRequestError, UnknownAgentError
from server.observability.metrics import Metrics
from server.observability.traces import load_trace
from server.observability.tracing import Tracing
from server.runs.approvals import decide
from server.runs.idempotency import IdempotencyKey
from server.runs.memo import PostMemo
from server.runs.records import (
    Accepted,
    Expected,
    NewRun,
    PostClaimer,
    accept_expected,
    accept_message,
    get_run,
    request_cancel,
)
from server.runs.toolbox import principal_toolbox
from server.settings import Settings
from server.subagents.traces import with_children
from server.subagents.wake import report_to_parent
from server.usage.registry import ModelRegistry
from server.usage.routing import pick_model
from tools.errors import ToolCallError
from tools.registry import ToolRegistry
from tools.validation import validate_args


@dataclass(frozen=True)
class NewMessage:
    """A user message as the API accepted it, before a model is picked for its run."""

    conversation_id: str
    content: str
    model: str | None
    agent: str | None
    options: dict[str, Any]
    needs: list[str]
    if_busy: str | None
    idempotency: IdempotencyKey | None


@dataclass(frozen=True)
class RunService:
    """The runs side of the API, bound to one process's pool, registries and telemetry."""

    pool: Pool
    settings: Settings
    models: ModelRegistry
    tools: ToolRegistry
    metrics: Metrics
    tracing: Tracing
    memo: PostMemo
    claimer: PostClaimer | None = None  # this process's worker, if it runs one

    async def post_message(self, who: Principal, message: NewMessage) -> Accepted:
        """Store a user message and queue a run for it, under the caller's limits.

        A conversation this process has met (created, or posted to) is posted to in one round
        trip, with a check of what was remembered of it (docs/decisions/2017); otherwise, and
        when the check fails, in two, reading the conversation and the profile first.

        Returns:
            The API's answer, whether it replays an earlier request's with the same
            idempotency key (then nothing was created), and the new run's first events.

        Raises:
            ConversationNotFoundError: no such conversation for the caller's tenant.
            UnknownAgentError: the message or conversation names no profile of the tenant.
            UnknownModelError: the model picked names no usable model.
            ConversationBusyError, TooManyRunsError: refused by the `reject` policies.
            IdempotencyKeyReusedError: the key was used with a different body.
        """
        accepted = await self._post_remembered(who, message)
        if accepted is None:
            accepted = await self._post_read(who, message)
        if not accepted.replayed:
            self.metrics.events_written.inc()  # run.created
        return accepted

    def met_conversation(self, who: Principal, row: dict[str, Any]) -> None:
        """Remember a conversation this process created, for the posts to come."""
        self.memo.met_conversation(who.tenant_id, row)

    async def _post_remembered(self, who: Principal, message: NewMessage) -> Accepted | None:
        """Post in one round trip from what is remembered; None if nothing was stored.

        Only for a conversation and an unpinned profile both remembered, and no idempotency
        key (its check reads). Any refusal from what was remembered (an unknown model, say)
        is left to the reading path, which answers in the usual order (404 first).
        """
        memo, tenant = self.memo, who.tenant_id
        if message.idempotency is not None:
            return None
        conversation = memo.conversation(tenant, message.conversation_id)
        if conversation is None:
            return None
        try:
            name, version = parse_ref(message.agent or conversation.agent or DEFAULT_AGENT)
        except AgentrtError:
            return None
        agent = memo.agent(tenant, name) if version is None else None
        if agent is None:
            return None
        try:
            new = self._new_run(who, message, conversation.model, agent)
        except AgentrtError:
            return None
        expected = Expected(conversation.agent, conversation.model, name, agent.version)
        accepted = await accept_expected(self.pool, who, new, expected, self.claimer)
        if accepted is None:
            memo.forget(tenant, message.conversation_id, name)
        return accepted

    async def _post_read(self, who: Principal, message: NewMessage) -> Accepted:
        """Post in two round trips: the conversation and the profile are read first."""
        # The profile the run will most likely use (the message's, else the conversation's,
        # which is the default one unless the conversation names another) is read in the
        # round trip that locks the conversation; `build` checks that the guess was right.
        early: AgentVersion | UnknownAgentError | None = None
        met: tuple[dict[str, Any], AgentVersion, str | None] | None = None

        async def guess(conn: Conn) -> None:
            nonlocal early
            try:
                early = await resolve_agent(conn, who.tenant_id, message.agent)
            except UnknownAgentError as exc:  # raised by `build`, after the conversation's 404
                early = exc

        async def build(conn: Conn, conversation: dict[str, Any]) -> NewRun:
            nonlocal met
            # In the transaction that locks the conversation: its row is read once.
            ref = message.agent or conversation["agent"]
            found = early if ref == message.agent else None
            if isinstance(found, UnknownAgentError):
                raise found
            agent = found or await resolve_agent(conn, who.tenant_id, ref)
            new = self._new_run(who, message, conversation["model"], agent)
            met = (conversation, agent, ref)
            return new

        accepted = await accept_message(
            self.pool,
            who,
            message.conversation_id,
            build,
            message.idempotency,
            guess,
            self.claimer,
        )
        if met is not None:
            conversation, agent, ref = met
            self.memo.met_conversation(who.tenant_id, conversation)
            if parse_ref(ref or DEFAULT_AGENT)[1] is None:  # read as the latest version
                self.memo.met_agent(who.tenant_id, agent)
        return accepted

    def _new_run(
        self,
        who: Principal,
        message: NewMessage,
        conversation_model: str | None,
        agent: AgentVersion,
    ) -> NewRun:
        """The run of `message`, on a conversation with that model, with that profile."""
        settings = self.settings
        pick = pick_model(
            requested=message.model,
            conversation_model=conversation_model or agent.spec.model,
            text=message.content,
            needs=message.needs,
            rules=settings.model_routes,
            default=settings.default_model,
        )
        model = self.models.validate(pick.model_id)
        options = dict(message.options)
        if agent.spec.run_timeout_seconds is not None:
            options.setdefault("timeoutSeconds", agent.spec.run_timeout_seconds)
        limits = settings.tenant_limits.get(who.tenant_id, {})
        user_limit = limits.get("userMaxActiveRuns", settings.user_max_active_runs)
        return NewRun(
            message.conversation_id,
            message.content,
            model,
            options,
            if_busy=message.if_busy or settings.conversation_busy_policy,
            user_limit=user_limit if settings.limit_policy == "reject" else None,
            model_source=pick.source,
            agent=(agent.name, agent.version),
        )

    async def cancel(self, who: Principal, run_id: str) -> Run:
        """Cancel the run: at once if queued or waiting, else at the worker's next safe point.

        Returns:
            The run after the request.

        Raises:
            RunNotFoundError: no such run for the caller's tenant.
            RunFinishedError: the run already ended.
        """
        run = await request_cancel(self.pool, who, run_id)
        if run.status == RunStatus.CANCELLED:
            self.metrics.events_written.inc()  # run.cancelled, stored by this request
            if run.parent_run_id is not None:
                await report_to_parent(self.pool, run.parent_run_id)
        return run

    async def decide(
        self,
        who: Principal,
        approval_id: str,
        *,
        decision: str,
        reason: str | None,
        args: dict[str, Any] | None,
    ) -> dict[str, Any]:
        """Decide a pending approval; edited arguments are checked against the tool's schema.

        Returns:
            The approval's row once decided.

        Raises:
            ApprovalNotFoundError, ApprovalForbiddenError, ApprovalDecidedError: see `decide`.
            InvalidRequestError: the tool is gone, or the edited arguments do not fit it.
        """
        row = await decide(
            self.pool,
            who,
            approval_id,
            decision=decision,
            reason=reason,
            args=args,
            check_args=lambda row, edited: self._check_args(who, row["tool_name"], edited),
        )
        self.metrics.approval_wait.observe(
            (row["decided_at"] - row["requested_at"]).total_seconds()
        )
        self.tracing.record_span(
            row["run_id"],
            "approval.wait",
            row["requested_at"],
            row["decided_at"],
            {
                "agentrt.kind": "approval",
                "agentrt.tenant_id": row["tenant_id"],
                "agentrt.conversation_id": row["conversation_id"],
                "agentrt.tool.name": row["tool_name"],
                "agentrt.approval.status": row["status"],
                "agentrt.approval.by": row["decided_by"],
            },
        )
        return row

    async def _check_args(
        self, who: Principal, tool_name: str, args: dict[str, Any]
    ) -> dict[str, Any]:
        toolbox = await principal_toolbox(self.tools, self.pool, who)
        spec = toolbox.specs.get(tool_name)
        if spec is None:
            raise InvalidRequestError(f"tool {tool_name} is no longer available")
        try:
            return validate_args(spec, args)
        except ToolCallError as exc:
            raise InvalidRequestError(exc.message) from exc

    async def trace(self, who: Principal, run_id: str) -> dict[str, Any]:
        """Return the run's span tree (its child runs' as subtrees), unstored spans included.

        Raises:
            RunNotFoundError: no such run for the caller's tenant.
        """
        await self.tracing.sink.flush()
        async with self.pool.connection() as conn:
            run = await get_run(conn, who, run_id)
            return await with_children(conn, await load_trace(conn, run), run)
