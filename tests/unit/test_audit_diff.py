"""Audit diffs say what changed, by key, and never show a secret."""

from __future__ import annotations

import pytest

from server.lifecycle.audit import small_diff

pytestmark = pytest.mark.timeout(10)


def test_a_diff_lists_changed_keys_with_short_values() -> None:
    before = {"allow": ["a"], "max_parallel_tools": 2, "grants": {"*": ["x"]}}
    after = {"allow": ["a", "b"], "max_parallel_tools": 4, "grants": {"*": ["x"]}}

    assert small_diff(before, after) == {
        "allow": {"from": "<1 items>", "to": "<2 items>"},
        "max_parallel_tools": {"from": 2, "to": 4},
    }


def test_secrets_are_redacted_at_any_depth_even_when_added() -> None:
    after = {
        "mcp_servers": {"crm": {"url": "https://x", "headers": {"Authorization": "Bearer s3cr3t"}}},
        "api_key": "sk-live-1",
    }

    diff = small_diff(None, after)

    assert diff["mcp_servers.crm.headers"] == {"from": "[redacted]", "to": "[redacted]"}
    assert diff["api_key"] == {"from": "[redacted]", "to": "[redacted]"}
    assert diff["mcp_servers.crm.url"] == {"from": None, "to": "https://x"}
    assert "s3cr3t" not in str(diff) and "sk-live" not in str(diff)


def test_long_text_is_cut_and_an_unchanged_config_has_no_diff() -> None:
    assert small_diff({"a": 1}, {"a": 1}) == {}
    cut = small_diff({}, {"instructions": "x" * 500})["instructions"]["to"]
    assert len(cut) == 201 and cut.endswith("…")
