"""Every event type is emitted through `EventType` and documented, with its fields, in
docs/events.md."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from graphs.events import PAYLOADS, STREAM_KEYS, EventType
from server.events.projection import StreamProjector

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "events.md"
# Calls that take an event type, and the custom-stream key that holds one.
EMITTERS = {"NewEvent", "emit", "_emit", "finish", "_finish"}
TYPE_KEY = "event"


def documented_rows() -> dict[str, set[str]]:
    """Map each event type in a table of docs/events.md to the names its rows quote."""
    rows: dict[str, set[str]] = {}
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            continue
        first, _, rest = line.strip("|").partition("|")
        quoted = set(re.findall(r"`([^`]+)`", rest))
        words = {w for q in quoted for w in re.findall(r"[A-Za-z]+", q)}
        for kind in re.findall(r"`([a-z.]+)`", first):
            rows.setdefault(kind, set()).update(words)
    return rows


def fields_of(payload: type) -> set[str]:
    """Return every key of a payload TypedDict that is stored, required or not."""
    keys = set(payload.__required_keys__) | set(payload.__optional_keys__)  # type: ignore[attr-defined]
    return keys - STREAM_KEYS


def spells_a_type(arg: ast.expr) -> bool:
    """Say whether `arg` is an event type written as a string (or built as an f-string)."""
    values = {t.value for t in EventType}
    if isinstance(arg, ast.Constant):
        return arg.value in values
    if isinstance(arg, ast.JoinedStr) and arg.values:
        head = arg.values[0]
        return isinstance(head, ast.Constant) and any(v.startswith(head.value) for v in values)
    return False


def literal_event_types(path: Path) -> list[str]:
    """Return the places in `path` that spell an event type as a string where one is emitted."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        candidates: list[ast.expr] = []
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in EMITTERS:
                candidates += node.args
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == TYPE_KEY:
                    candidates.append(value)
        found += [
            f"{path.relative_to(ROOT)}:{arg.lineno}" for arg in candidates if spells_a_type(arg)
        ]
    return found


def test_every_event_type_is_documented_and_every_documented_type_exists() -> None:
    documented = set(documented_rows())
    assert {t.value for t in EventType} - documented == set()
    assert documented - {t.value for t in EventType} == set()


def test_every_payload_field_is_documented_with_its_event_type() -> None:
    rows = documented_rows()
    missing = {
        kind.value: sorted(fields_of(PAYLOADS[kind]) - rows[kind.value]) for kind in EventType
    }
    assert {k: v for k, v in missing.items() if v} == {}


def test_every_event_type_has_a_payload_type() -> None:
    assert set(PAYLOADS) == set(EventType)


def test_events_are_emitted_through_event_type_never_spelled_as_strings() -> None:
    places = []
    for package in ("graphs", "nodes", "tools", "server"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path != ROOT / "graphs" / "events.py":
                places += literal_event_types(path)
    assert places == []


def test_a_custom_stream_event_of_an_unknown_type_is_not_stored() -> None:
    stored: list[str] = []
    projector = StreamProjector(lambda kind, data=None: stored.append(kind))
    projector.handle("custom", {"event": "my.own.thing", "n": 1})
    projector.handle("custom", {"event": "tools.unavailable", "source": "mcp:x", "reason": "down"})
    assert stored == [EventType.TOOLS_UNAVAILABLE]
