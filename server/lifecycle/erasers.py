"""What an erasure deletes, table by table: the one registry of per-table erasers.

A feature that stores data of a conversation or a user adds its `Eraser` here, before the
rows it references (the runs, then the conversation, go last). Each statement deletes by
predicate, so running it again after a crash deletes what is left and nothing else.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from server.db.pool import Conn
from server.runs.records import delete_runs

Params = dict[str, Any]
"""Conversation statements get `tenant`, `conversation`, `runs` (its run ids) and `traces`
(their trace ids); user statements get `tenant`, `user` and `prefix` (of memory namespaces)."""

Custom = Callable[[Conn, Params], Awaitable[int]]


@dataclass(frozen=True)
class Eraser:
    """Deletes one table's rows of a conversation, or of a user beyond their conversations.

    Attributes:
        name: The step's name, as counts and progress show it.
        table: The table; the step is skipped where it does not exist (a store not set up).
        sql: A DELETE (or UPDATE) statement whose row count is the step's count.
        custom: Instead of `sql`, code that must go through its module (the `runs` writer).
    """

    name: str
    table: str
    sql: str | None = None
    custom: Custom | None = None


async def _conversation_runs(conn: Conn, params: Params) -> int:
    return await delete_runs(conn, params["tenant"], conversation_id=params["conversation"])


async def _user_runs(conn: Conn, params: Params) -> int:
    return await delete_runs(conn, params["tenant"], user_id=params["user"])


_BY_RUN = "DELETE FROM {table} WHERE run_id = ANY(%(runs)s)"
_BY_THREAD = "DELETE FROM {table} WHERE thread_id = %(conversation)s"
_BY_CONVERSATION = "DELETE FROM {table} WHERE conversation_id = %(conversation)s"
_BY_USER = "DELETE FROM {table} WHERE tenant_id = %(tenant)s AND user_id = %(user)s"


# The rows go now; the stored bytes are deleted by the housekeeping job (`prune_artifacts`).
_ARTIFACT_VERSIONS = """
WITH gone AS (DELETE FROM artifact_versions WHERE run_id = %s RETURNING object_key)
INSERT INTO artifact_objects_erased (object_key) SELECT object_key FROM gone
ON CONFLICT DO NOTHING
"""


async def _span_sets(conn: Conn, params: Params) -> int:
    """Delete the conversation's span sets; count their spans."""
    cur = await conn.execute(
        "WITH gone AS (DELETE FROM trace_span_sets"
        " WHERE trace_id = ANY(%(traces)s) OR run_id = ANY(%(runs)s) RETURNING span_count)"
        " SELECT COALESCE(sum(span_count), 0) AS n FROM gone",
        params,
    )
    row = await cur.fetchone()
    return int(row["n"]) if row else 0


def _run_rows(table: str) -> Eraser:
    return Eraser(table, table, _BY_RUN.format(table=table))


CONVERSATION_ERASERS: tuple[Eraser, ...] = (
    Eraser(
        "trace_payloads",
        "trace_payloads",
        "DELETE FROM trace_payloads WHERE trace_id = ANY(%(traces)s)",
    ),
    Eraser("trace_spans", "trace_span_sets", custom=_span_sets),
    _run_rows("run_events"),
    _run_rows("context_manifests"),
    _run_rows("model_calls"),
    _run_rows("embedding_calls"),
    _run_rows("tool_ledger"),
    _run_rows("approvals"),
    _run_rows("memory_jobs"),
    # Memories learnt in this conversation's runs, in any user namespace of the tenant.
    Eraser(
        "memories",
        "store",
        "DELETE FROM store WHERE starts_with(prefix, %(tenant)s || '.users.')"
        " AND value->>'sourceRunId' = ANY(%(runs)s)",
    ),
    Eraser("checkpoint_writes", "checkpoint_writes", _BY_THREAD.format(table="checkpoint_writes")),
    Eraser("checkpoint_blobs", "checkpoint_blobs", _BY_THREAD.format(table="checkpoint_blobs")),
    Eraser("checkpoints", "checkpoints", _BY_THREAD.format(table="checkpoints")),
    Eraser(
        "idempotency_keys", "idempotency_keys", _BY_CONVERSATION.format(table="idempotency_keys")
    ),
    Eraser(
        "context_summaries", "context_summaries", _BY_CONVERSATION.format(table="context_summaries")
    ),
    Eraser("messages", "messages", _BY_CONVERSATION.format(table="messages")),
    # Artifact versions of these runs: their objects are queued for the housekeeping job.
    Eraser("artifact_versions", "artifact_versions", _ARTIFACT_VERSIONS % "ANY(%(runs)s)"),
    Eraser("artifacts", "artifacts", _BY_CONVERSATION.format(table="artifacts")),
    Eraser("runs", "runs", custom=_conversation_runs),
    Eraser(
        "conversations",
        "conversations",
        "DELETE FROM conversations WHERE id = %(conversation)s AND tenant_id = %(tenant)s",
    ),
)
"""Erasing a conversation: these steps in order."""

USER_ERASERS: tuple[Eraser, ...] = (
    # Rows of the user's runs in conversations that are not theirs, then the runs.
    Eraser(
        "run_events",
        "run_events",
        "DELETE FROM run_events WHERE run_id IN"
        " (SELECT id FROM runs WHERE tenant_id = %(tenant)s AND user_id = %(user)s)",
    ),
    Eraser(
        "memories",
        "store",
        "DELETE FROM store WHERE prefix = %(prefix)s OR starts_with(prefix, %(prefix)s || '.')",
    ),
    Eraser("memory_jobs", "memory_jobs", _BY_USER.format(table="memory_jobs")),
    Eraser("embedding_calls", "embedding_calls", _BY_USER.format(table="embedding_calls")),
    Eraser("model_calls", "model_calls", _BY_USER.format(table="model_calls")),
    Eraser("model_usage_daily", "model_usage_daily", _BY_USER.format(table="model_usage_daily")),
    Eraser("messages", "messages", _BY_USER.format(table="messages")),
    Eraser(
        "artifact_versions",
        "artifact_versions",
        _ARTIFACT_VERSIONS
        % "ANY(ARRAY(SELECT id FROM runs WHERE tenant_id = %(tenant)s AND user_id = %(user)s))",
    ),
    Eraser("artifacts", "artifacts", _BY_USER.format(table="artifacts")),
    # The LangGraph API's crons of the user (their firings go with them).
    Eraser("lg_crons", "lg_crons", _BY_USER.format(table="lg_crons")),
    Eraser("runs", "runs", custom=_user_runs),
    Eraser(
        "api_keys_revoked",
        "api_keys",
        "UPDATE api_keys SET revoked_at = now() WHERE tenant_id = %(tenant)s"
        " AND user_id = %(user)s AND revoked_at IS NULL",
    ),
)
"""Erasing a user's data: after each of their conversations, these steps in order."""
