"""One error taxonomy: every error of the server is an `AgentrtError`, answered by one handler."""

from __future__ import annotations

import ast
import inspect
import logging
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from server import errors
from server.errors import AgentrtError
from server.routes.errors import install_error_handlers

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2]

SAMPLES: list[tuple[AgentrtError, int, str, dict[str, str]]] = [
    (errors.UnknownModelError("no model 'x'"), 400, "unknown_model", {}),
    (errors.InvalidIdempotencyKeyError("bad key"), 400, "invalid_idempotency_key", {}),
    (errors.UnauthorizedError("unknown or revoked API key"), 401, "unauthorized", {}),
    (errors.RunForbiddenError("not yours"), 403, "forbidden", {}),
    (errors.ApprovalForbiddenError("needs reviewer"), 403, "forbidden", {}),
    (errors.RunNotFoundError("run_1"), 404, "not_found", {}),
    (errors.ConversationNotFoundError("conv_1"), 404, "not_found", {}),
    (errors.ApprovalNotFoundError("apr_1"), 404, "not_found", {}),
    (
        errors.RunFinishedError("run_1", "completed"),
        409,
        "run_finished",
        {"runStatus": "completed"},
    ),
    (errors.IllegalTransitionError("completed", "running"), 409, "illegal_transition", {}),
    (
        errors.ConversationBusyError("conv_1", "run_1", "running"),
        409,
        "conversation_busy",
        {"runId": "run_1"},
    ),
    (
        errors.RunNotPausedError("run_1", "running", False),
        409,
        "not_paused",
        {"runStatus": "running"},
    ),
    (
        errors.ApprovalDecidedError("apr_1", "approved"),
        409,
        "already_decided",
        {"approvalStatus": "approved"},
    ),
    (
        errors.IdempotencyKeyReusedError("k", "run_1"),
        422,
        "idempotency_key_reused",
        {"runId": "run_1"},
    ),
    (errors.BadCursorError("c"), 422, "invalid_cursor", {}),
    (errors.AgentForbiddenError("needs admin"), 403, "forbidden", {}),
    (errors.AgentNotFoundError("support", 3), 404, "agent_not_found", {}),
    (errors.AgentExistsError("support"), 409, "agent_exists", {}),
    (errors.AgentReadOnlyError("declared in agents/support.yaml"), 409, "agent_read_only", {}),
    (errors.UnknownAgentError("no agent 'x'"), 422, "unknown_agent", {}),
    (errors.MemoryForbiddenError("needs admin"), 403, "forbidden", {}),
    (errors.MemoryNotFoundError("no memory mem_1"), 404, "memory_not_found", {}),
    (errors.InvalidMemoryError("text must not be empty"), 422, "invalid_memory", {}),
    (errors.BadAgentReferenceError("'a@b' is not name@version"), 422, "unknown_agent", {}),
    (errors.ToolConfigError("stdio servers are the operator's"), 422, "invalid_tool_config", {}),
    (errors.InvalidRequestError("args.x: required"), 422, "invalid_request", {}),
    (errors.TooLargeError("content has 9 characters; the limit is 8"), 413, "too_large", {}),
    (errors.TooManyRunsError(2, 2), 429, "too_many_runs", {}),
    (errors.ArtifactNotFoundError("no artifact art_1"), 404, "artifact_not_found", {}),
    (errors.ArtifactTooLargeError("over the limit"), 413, "too_large", {}),
    (
        errors.RangeNotSatisfiableError("past the end", size="10"),
        416,
        "range_not_satisfiable",
        {"size": "10"},
    ),
    (errors.SkillNotFoundError("skill 'x' not found"), 404, "skill_not_found", {}),
    (errors.InvalidSkillError("SKILL.md must start with"), 422, "invalid_skill", {}),
    (errors.SkillForbiddenError("needs admin"), 403, "forbidden", {}),
    (
        errors.RunNotRetryableError("run_1", "it is still running"),
        409,
        "not_retryable",
        {"runId": "run_1"},
    ),
    (errors.EventsExpiredError("run_1", "2026-01-01"), 410, "events_expired", {"runId": "run_1"}),
    (errors.RunsActiveError("user u", ["run_1"], False), 409, "runs_active", {"runIds": "run_1"}),
    (errors.AssistantNotFoundError("a1"), 404, "not_found", {}),
    (errors.ThreadNotFoundError("t1"), 404, "not_found", {}),
    (errors.LangGraphItemNotFoundError("run r1 not found"), 404, "not_found", {}),
    (errors.ThreadExistsError("t1"), 409, "thread_exists", {}),
    (errors.ThreadBusyError("t1", "run_1"), 409, "thread_busy", {"runId": "run_1"}),
    (errors.UnknownGraphError("g"), 422, "unknown_graph", {}),
    (errors.InvalidGraphRequestError("send input or command"), 422, "invalid_graph_request", {}),
    (errors.UnknownReferenceError("thread t has no checkpoint 'x'"), 422, "unknown_reference", {}),
    (errors.AssistantExistsError("a1"), 409, "assistant_exists", {}),
    (errors.AssistantReadOnlyError("a1"), 409, "assistant_read_only", {}),
    (errors.KnowledgeForbiddenError("needs knowledge-editor"), 403, "forbidden", {}),
    (errors.KnowledgeBaseNotFoundError("kb_1"), 404, "knowledge_base_not_found", {}),
    (errors.DocumentNotFoundError("doc_1"), 404, "document_not_found", {}),
    (errors.KnowledgeBaseExistsError("handbook"), 409, "knowledge_base_exists", {}),
    (errors.InvalidDocumentError("not UTF-8"), 422, "invalid_document", {}),
    (errors.InvalidKnowledgeBaseError("unknown model"), 422, "invalid_knowledge_base", {}),
    (errors.UrlNotAllowedError("host not allowed"), 422, "url_not_allowed", {}),
]
# Errors the API never answers as they are: a 500 without their message.
INTERNAL = [
    errors.LeaseLostError("run_1: lease generation 3 superseded"),
    errors.RunTimeoutError("the run passed its deadline"),
    errors.StartupError("port 8000 is taken"),
    errors.AgentFileError("agents/x.yaml: needs `name`"),
    errors.JobLeaseLostError("plan not saved: the job was taken over"),
    errors.MemoryConfigError("unknown embedding provider 'x'"),
    errors.MemoryUnavailableError("this server has no memory store"),
]
# The groups, never raised themselves.
BASES = {errors.AgentrtError, errors.BadRequestError, errors.ForbiddenError}
BASES |= {errors.NotFoundError, errors.ConflictError}


def _app(error: Exception) -> TestClient:
    app = FastAPI()
    install_error_handlers(app, max_body_bytes=1000)

    @app.get("/boom")
    async def boom() -> None:
        raise error

    return TestClient(app, raise_server_exceptions=False)


def _concrete_errors() -> set[type[AgentrtError]]:
    return {
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, AgentrtError) and cls.__module__ == errors.__name__
    }


def _is_exception(base: ast.expr) -> bool:
    name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
    return name.endswith(("Error", "Exception", "Timeout"))


def test_every_error_class_of_the_server_is_defined_in_the_taxonomy() -> None:
    strays = []
    for path in (ROOT / "server").rglob("*.py"):
        if path.parent.name == "client" or path == ROOT / "server" / "errors.py":
            continue  # the client's ClientError is reported at a terminal, never answered
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(map(_is_exception, node.bases)):
                strays.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert strays == []


def test_every_error_has_a_sample_here() -> None:
    sampled = {type(e) for e, *_ in SAMPLES} | {type(e) for e in INTERNAL}
    assert _concrete_errors() - BASES == sampled


@pytest.mark.parametrize(("error", "status", "code", "fields"), SAMPLES, ids=lambda v: str(v))
def test_each_error_is_answered_with_its_status_code_message_and_fields(
    error: AgentrtError, status: int, code: str, fields: dict[str, str]
) -> None:
    response = _app(error).get("/boom")
    assert response.status_code == status
    assert response.json() == {"error": {"code": code, "message": str(error), **fields}}
    if status == 429:
        assert response.headers["Retry-After"] == "5"


@pytest.mark.parametrize("error", INTERNAL, ids=lambda e: type(e).__name__)
def test_an_internal_error_is_answered_500_without_its_message(
    error: AgentrtError, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="server.app"):
        response = _app(error).get("/boom")
    assert response.status_code == 500
    body = response.json()["error"]
    assert body["code"] == "internal_error"
    assert str(error) not in body["message"]
    assert body["requestId"] in body["message"]
    assert body["requestId"] in caplog.text


def test_every_answered_code_is_documented() -> None:
    docs = "".join(p.read_text(encoding="utf-8") for p in (ROOT / "docs").glob("api*.md"))
    answered = {cls.code for cls in _concrete_errors() - BASES if cls.status < 500}
    assert sorted(c for c in answered if f"`{c}`" not in docs) == []
