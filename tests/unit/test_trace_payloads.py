"""A span's payload is the redacted JSON of its data, however the redaction is reached."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from server.observability.callbacks import redacted_json
from server.settings import Settings
from tools.validation import redact

FIELDS = Settings.model_fields["redact_fields"].default


def walked(data: Any, fields: list[str]) -> Any:
    """What the payload was before: the redaction's walk over everything, then the dump."""
    return json.loads(json.dumps(redact(data, fields, json_text=True), default=str))


KEYS = st.sampled_from(
    ["content", "type", "input_tokens", "Token", "API_KEY", "apikeys", "my_password", "id"]
)
TEXT = st.text(max_size=12).filter(lambda t: t[:1] not in ("{", "["))
DATA = st.recursive(
    st.none() | st.booleans() | st.integers() | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(DATA)
def test_the_payload_is_what_the_full_walk_gives(data: Any) -> None:
    assert json.loads(redacted_json(data, FIELDS)) == walked(data, FIELDS)


def test_a_long_history_without_secrets_is_dumped_as_it_is() -> None:
    history = [
        {"type": "human", "data": {"content": f"my password is safe, turn {n}"}} for n in range(50)
    ] + [{"type": "ai", "data": {"usage_metadata": {"input_tokens": 5, "output_tokens": 2}}}]
    assert redacted_json(history, FIELDS) == json.dumps(
        history, separators=(",", ":"), ensure_ascii=False
    )


def test_secrets_are_redacted_at_any_depth_and_in_json_text() -> None:
    nested = json.dumps({"call": json.dumps({"Api_Key": "sk-inner"})})
    data = {
        "messages": [{"tool_calls": [{"args": {"API_KEY": "sk-1", "q": "x"}}]}],
        "raw": '{"password" : "hunter2"}',
        "deeper": nested,
    }
    text = redacted_json(data, FIELDS)
    assert "sk-1" not in text and "hunter2" not in text and "sk-inner" not in text
    assert json.loads(text) == walked(data, FIELDS)


def test_a_field_json_cannot_write_as_it_is_makes_every_payload_walked() -> None:
    fields = ["clé"]  # not ASCII: a dump escapes it, so the text cannot be searched for it
    data = {"Clé": "secret", "other": 1}
    assert json.loads(redacted_json(data, fields)) == {"Clé": "[redacted]", "other": 1}
