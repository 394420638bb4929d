"""The checks before a tool runs: schemas, normalisation, access, risk, redaction, budgets."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from langchain_core.tools import StructuredTool, ToolException

from tools.config import TenantToolConfig, ToolConfig
from tools.errors import RetryableToolError, ToolCallError
from tools.errors import error_type_of as classify
from tools.policy import Toolbox, prepare
from tools.spec import CallContext, RetryPolicy, agent_tool
from tools.validation import REDACTED, cut_output, redact, render_output, validate_args


@agent_tool(risk="high", permissions={"email:send"}, idempotent=False, dedupes=True)
async def send_email(to: str, subject: str, call: CallContext, cc: int = 0) -> str:
    """Send an email.

    Args:
        to: The recipient.
        subject: The subject line.
        cc: How many copies.
    """
    return call.idempotency_key


def mcp_like_tool() -> StructuredTool:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer", "default": 1}},
        "required": ["a"],
    }

    async def run(**kwargs: Any) -> str:
        return "ok"

    return StructuredTool(name="add", description="Add.", args_schema=schema, coroutine=run)


def test_schema_comes_from_the_signature_and_hides_the_call_context() -> None:
    schema = send_email.input_schema()
    assert set(schema["properties"]) == {"to", "subject", "cc"}
    assert schema["properties"]["to"]["description"] == "The recipient."
    assert send_email.context_arg == "call"
    assert send_email.description.startswith("Send an email.")


def test_arguments_are_validated_and_normalised() -> None:
    assert validate_args(send_email, {"to": "a@b", "subject": "hi", "cc": "2"}) == {
        "to": "a@b",
        "subject": "hi",
        "cc": 2,
    }
    with pytest.raises(ToolCallError) as missing:
        validate_args(send_email, {"to": "a@b"})
    assert missing.value.error_type == "invalid_arguments"
    assert "subject: Field required" in missing.value.message
    with pytest.raises(ToolCallError, match=r"unexpected argument\(s\) bcc"):
        validate_args(send_email, {"to": "a", "subject": "s", "bcc": "x"})


def test_json_schema_tools_are_validated_and_get_defaults() -> None:
    add = Toolbox.of([mcp_like_tool()]).specs["add"]
    assert validate_args(add, {"a": 2}) == {"a": 2, "b": 1}
    with pytest.raises(ToolCallError, match="a: 'x' is not of type 'integer'"):
        validate_args(add, {"a": "x"})


def test_checks_run_in_order_and_refusals_name_their_reason() -> None:
    config = ToolConfig(default=TenantToolConfig(deny=["add"], grants={"*": []}))
    toolbox = Toolbox.of([send_email, mcp_like_tool()]).__class__(
        specs=Toolbox.of([send_email, mcp_like_tool()]).specs,
        allowed=frozenset({"send_email"}),
        permissions=frozenset(),
        config=config.for_tenant("t"),
    )
    assert prepare(toolbox, "1", "nope", {}).error.error_type == "unknown_tool"  # type: ignore[union-attr]
    bad = prepare(toolbox, "2", "add", {"a": "x"})
    assert bad.error is not None and bad.error.error_type == "invalid_arguments"
    assert prepare(toolbox, "3", "add", {"a": 1}).error.error_type == "forbidden"  # type: ignore[union-attr]
    denied = prepare(toolbox, "4", "send_email", {"to": "x", "subject": "y"})
    assert denied.error is not None and denied.error.error_type == "permission_denied"
    assert "email:send" in denied.error.message
    assert [t.name for t in toolbox.visible()] == []


def test_high_risk_needs_approval_and_overrides_change_it() -> None:
    toolbox = Toolbox.of([send_email])
    call = prepare(toolbox, "1", "send_email", {"to": "x", "subject": "y"})
    assert call.error is None and call.needs_approval
    assert "high-risk" in call.approval_reason
    never = ToolConfig(
        default=TenantToolConfig.model_validate({"tools": {"send_email": {"approval": "never"}}})
    )
    relaxed = Toolbox(specs=toolbox.specs, allowed=toolbox.allowed, config=never.for_tenant("t"))
    assert not prepare(relaxed, "1", "send_email", {"to": "x", "subject": "y"}).needs_approval


def test_tenant_overlay_can_only_narrow_the_operator_allow_list() -> None:
    operator = ToolConfig.model_validate(
        {"default": {"deny": ["fetch_url"]}, "tenants": {"acme": {"grants": {"*": ["a"]}}}}
    )
    resolved = operator.for_tenant("acme", TenantToolConfig(allow=["*"], deny=[]))
    assert not resolved.allows("fetch_url")
    assert resolved.allows("calculator")
    narrowed = operator.for_tenant("acme", TenantToolConfig(allow=["calc*"]))
    assert not narrowed.allows("current_time")
    assert resolved.permissions_for({"anyone"}) == {"a"}
    assert operator.for_tenant("other").permissions_for({"admin"}) == {"*"}


def test_redaction_reaches_nested_fields() -> None:
    args = {"user": "bob", "Password": "x", "nested": [{"token": "t", "ok": 1}]}
    assert redact(args, {"password", "token"}) == {
        "user": "bob",
        "Password": REDACTED,
        "nested": [{"token": REDACTED, "ok": 1}],
    }


def test_large_results_are_cut_with_a_note() -> None:
    text, cut = cut_output("x" * 50_000, 1000)
    assert cut and text.startswith("x" * 1000)
    assert "[cut: showing the first 1000 of 50000 characters" in text
    rows = json.dumps([{"id": i, "name": f"row {i}"} for i in range(1000)])
    text, cut = cut_output(rows, 500)
    assert cut and "of 1000 items" in text
    assert json.loads(text.split("\n[cut")[0])[0] == {"id": 0, "name": "row 0"}
    assert cut_output("short", 100) == ("short", False)


def test_outputs_are_rendered_as_text() -> None:
    assert render_output({"a": 1}) == '{"a": 1}'
    assert render_output([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]) == "a\nb"
    assert render_output(42) == "42"


def test_errors_are_classified_for_retry() -> None:
    request = httpx.Request("GET", "http://x")
    assert classify(TimeoutError()) == "timeout"
    assert classify(httpx.ConnectError("down", request=request)) == "connection"
    response = httpx.Response(429, request=request)
    assert classify(httpx.HTTPStatusError("slow down", request=request, response=response)) == (
        "rate_limited"
    )
    assert classify(RetryableToolError("again")) == "retryable"
    assert classify(ToolException("bad input")) == "tool_error"
    assert classify(ExceptionGroup("g", [ConnectionResetError()])) == "connection"
    assert classify(ValueError("x")) == "error"


def test_backoff_grows_and_is_capped() -> None:
    policy = RetryPolicy(max_attempts=5, initial_backoff_s=1, max_backoff_s=3)
    assert all(0 <= policy.backoff(n) <= min(3, 2 ** (n - 1)) for n in range(1, 6))
