"""Fault classes, Retry-After parsing and backoff: which failures are retried, and when."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import openai
import pytest

from nodes.models.caller import ModelPolicy
from nodes.models.faults import ModelCallError, ModelErrorClass, classify, parse_retry_after

E = ModelErrorClass


def status_error(status: int, body: dict[str, object], headers: dict[str, str] | None = None):
    request = httpx.Request("POST", "http://x/v1/chat/completions")
    response = httpx.Response(status, headers=headers, json=body, request=request)
    return openai.APIStatusError("boom", response=response, body=body)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("status", "body", "expected", "retryable"),
    [
        (408, {}, E.TIMEOUT, True),
        (409, {}, E.CONFLICT, True),
        (429, {}, E.RATE_LIMITED, True),
        (500, {}, E.SERVER_ERROR, True),
        (503, {}, E.SERVER_ERROR, True),
        (400, {"code": "invalid_value"}, E.INVALID_REQUEST, False),
        (400, {"code": "context_length_exceeded"}, E.CONTEXT_LENGTH_EXCEEDED, False),
        (400, {"code": "content_filter"}, E.CONTENT_FILTER, False),
        (401, {}, E.AUTHENTICATION, False),
        (403, {}, E.PERMISSION_DENIED, False),
        (404, {}, E.NOT_FOUND, False),
    ],
)
def test_http_statuses_map_to_classes_and_retry_policy(
    status: int, body: dict[str, object], expected: ModelErrorClass, retryable: bool
) -> None:
    error = classify(status_error(status, body), provider="openai", model="m")
    assert error.error_class == expected
    assert error.retryable is retryable
    assert error.status_code == status
    assert (error.provider, error.model) == ("openai", "m")


def test_transport_and_parse_errors_are_retryable() -> None:
    request = httpx.Request("POST", "http://x")
    cases = {
        openai.APITimeoutError(request): E.TIMEOUT,
        openai.APIConnectionError(request=request): E.CONNECTION,
        httpx.RemoteProtocolError("peer closed connection"): E.CONNECTION,
        httpx.ReadTimeout("slow"): E.TIMEOUT,
        json.JSONDecodeError("Expecting value", "{", 1): E.BAD_RESPONSE,
    }
    for exc, expected in cases.items():
        error = classify(exc, provider="p", model="m")
        assert error.error_class == expected, exc
        assert error.retryable


def test_an_unknown_exception_is_not_retried() -> None:
    error = classify(RuntimeError("adapter bug"), provider="p", model="m")
    assert error.error_class == E.UNKNOWN and not error.retryable


def test_retry_after_comes_from_the_exception_headers() -> None:
    exc = status_error(429, {}, {"Retry-After": "7"})
    assert classify(exc, provider="p", model="m").retry_after_s == 7.0


def test_retry_after_forms() -> None:
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert parse_retry_after({"Retry-After": "3"}) == 3.0
    when = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    delay = parse_retry_after({"retry-after": when})
    assert delay is not None and 28 <= delay <= 30
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after(None) is None


def test_backoff_grows_with_equal_jitter_and_retry_after_wins() -> None:
    policy = ModelPolicy(backoff_base_s=1.0, backoff_max_s=5.0, retry_after_max_s=10.0)
    rng = random.Random(1)
    plain = ModelCallError(E.SERVER_ERROR, "x")
    for attempt, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (9, 5.0)]:
        delay = policy.delay(attempt, plain, rng)
        assert delay is not None and ceiling / 2 <= delay <= ceiling
    asked = ModelCallError(E.RATE_LIMITED, "x", retry_after_s=8.0)
    assert policy.delay(1, asked, rng) == 8.0
    too_long = ModelCallError(E.RATE_LIMITED, "x", retry_after_s=11.0)
    assert policy.delay(1, too_long, rng) is None
