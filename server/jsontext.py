r"""JSON text of what the server stores and sends, written by orjson.

orjson writes the same JSON values as `json.dumps`, about ten times faster, and compact: no
spaces after separators, non-ASCII characters as UTF-8 instead of `\u` escapes (Postgres
parses either into the same `jsonb`). Whatever orjson refuses goes to `json.dumps`: integers
beyond 64 bits, keys that are not strings, strings with lone surrogates, nesting deeper than
254 levels. Dates, times and dataclasses are handed to `default`, as `json.dumps` hands them.
What differs from `json.dumps` with the same `default`:

- NaN and infinities become `null`; `json.dumps` writes `NaN` and `Infinity`, which are not
  JSON, and Postgres refuses them.
- Enum members and UUIDs are written as their values, not handed to `default`.

See docs/decisions/2023-json-text-by-orjson.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import orjson

_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
# How JSON text writes a NUL character, which Postgres text and `jsonb` cannot hold. Text that
# does not hold it holds no NUL; text that does may only hold an escaped backslash before "u0000".
NUL_ESCAPE = "\\u0000"
_NUL_ESCAPE_BYTES = NUL_ESCAPE.encode()


def dumps_bytes(value: Any, default: Callable[[Any], Any] | None = None) -> bytes:
    """`value` as UTF-8 JSON text; `default` turns what JSON cannot hold into what it can."""
    try:
        return orjson.dumps(value, default=default, option=_OPTIONS)
    except TypeError:  # orjson.JSONEncodeError is one
        return json.dumps(value, default=default).encode()


def stored_bytes(value: Any, default: Callable[[Any], Any] | None = None) -> bytes:
    """`dumps_bytes` for a `jsonb` value: its NUL characters, which `jsonb` refuses, as U+FFFD."""
    text = dumps_bytes(value, default)
    if _NUL_ESCAPE_BYTES in text:
        text = dumps_bytes(storable(value), default)
    return text


def dumps(value: Any, default: Callable[[Any], Any] | None = None) -> str:
    """`value` as JSON text; `default` turns what JSON cannot hold into what it can."""
    return dumps_bytes(value, default).decode()


# Characters Postgres `text` and `jsonb` cannot hold (NUL) or UTF-8 cannot encode (a lone
# surrogate, which JSON's `\u` escapes can still spell).
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(value: Any) -> Any:
    """`value` with every NUL character and lone surrogate in its strings (keys too) as U+FFFD."""
    if isinstance(value, str):
        return UNSTORABLE.sub("\ufffd", value)
    if isinstance(value, Mapping):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable(v) for v in value]
    return value
