"""JSON text by orjson: the values `json.dumps` writes, and its text where orjson refuses."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

import pytest

from server.jsontext import NUL_ESCAPE, dumps, dumps_bytes, storable, stored_bytes


class Kind(enum.StrEnum):
    TOOL = "tool"


@dataclasses.dataclass
class Point:
    x: int


SAMPLES: list[Any] = [
    {"delta": "word ", "itemId": "lc_run--01a2"},
    {"nested": [1, 2.5, -0.0, 1e16, 1e-7, True, False, None, {"deep": ["é", "中", "\x00"]}]},
    {"quote": 'say "hi"\n\ttab \\ slash', "emoji": "😀"},
    [Kind.TOOL, {Kind.TOOL: 1}],
    OrderedDict([("b", 1), ("a", 2)]),
    (1, 2, 3),
    2**63 - 1,
    "",
    [],
    {},
]


@pytest.mark.parametrize("value", SAMPLES)
def test_it_writes_the_value_json_dumps_writes(value: Any) -> None:
    assert json.loads(dumps(value)) == json.loads(json.dumps(value))
    assert dumps_bytes(value) == dumps(value).encode()


def test_it_is_compact_and_keeps_the_keys_order() -> None:
    assert dumps({"b": 1, "a": [1, "ü"]}) == '{"b":1,"a":[1,"ü"]}'


@pytest.mark.parametrize(
    "value",
    [
        2**70,  # beyond 64 bits
        {1: "a", None: "b", 2.5: "c", False: "d"},  # keys that are not strings
        {"lone": "\ud800"},  # a lone surrogate: not UTF-8
        json.loads("[" * 300 + "]" * 300),  # deeper than orjson goes
    ],
)
def test_what_orjson_refuses_is_written_by_json_dumps(value: Any) -> None:
    assert dumps(value) == json.dumps(value)


def test_dates_and_dataclasses_go_to_default_as_with_json_dumps() -> None:
    value = {"at": datetime(2026, 12, 4, 15, 0, tzinfo=UTC), "point": Point(3)}
    assert dumps(value, default=str) == json.dumps(value, default=str, separators=(",", ":"))
    with pytest.raises(TypeError):
        dumps(value)


def test_nan_and_infinities_become_null() -> None:
    assert json.loads(dumps([math.nan, math.inf, -math.inf])) == [None, None, None]


def test_what_neither_can_write_raises_type_error() -> None:
    with pytest.raises(TypeError):
        dumps({"x": object()})


def test_a_nul_character_shows_in_the_text_and_is_replaced_everywhere() -> None:
    value = {"k\x00": ["a\x00b", ("\x00", 1)], "n": None}
    assert NUL_ESCAPE in dumps(value)
    assert storable(value) == {"k\ufffd": ["a\ufffdb", ["\ufffd", 1]], "n": None}
    assert NUL_ESCAPE not in dumps(storable(value))
    assert NUL_ESCAPE not in dumps({"text": "no NUL here"})


def test_stored_bytes_write_a_nul_character_as_u_fffd() -> None:
    assert json.loads(stored_bytes({"k\x00": "a\x00b", "n": math.nan})) == {
        "k\ufffd": "a\ufffdb",
        "n": None,
    }
    assert stored_bytes({"a": "b"}) == dumps_bytes({"a": "b"})
