"""A batch's adjacent text pieces of one item are stored as one delta, in order."""

from __future__ import annotations

from graphs.events import EventType as E
from server.events.log import NewEvent
from server.events.writer import joined


def delta(item: str, text: object, **more: object) -> NewEvent:
    return NewEvent(E.MESSAGE_ITEM_DELTA, {"itemId": item, "delta": text, **more})


def test_adjacent_pieces_of_one_item_become_one_delta_in_order() -> None:
    created = NewEvent(E.MESSAGE_ITEM_CREATED, {"itemId": "a", "role": "assistant"})
    batch = [created, delta("a", "Hel"), delta("a", "lo, "), delta("a", "world")]
    assert joined(batch) == [created, delta("a", "Hello, world")]


def test_pieces_apart_or_of_other_items_stay_apart() -> None:
    note = NewEvent(E.TOOL_STARTED, {"toolCallId": "c"})
    batch = [delta("a", "1"), delta("b", "2"), delta("a", "3"), note, delta("a", "4")]
    assert joined(batch) == batch


def test_pieces_that_differ_beyond_their_text_stay_apart() -> None:
    batch = [delta("a", "1"), delta("a", "2", channel="reasoning"), delta("a", None)]
    assert joined(batch) == batch


def test_other_event_types_are_never_joined() -> None:
    chunk = NewEvent(E.GRAPH_CHUNK, {"mode": "messages", "delta": "x"})
    assert joined([chunk, chunk]) == [chunk, chunk]


def test_the_batch_given_is_not_changed() -> None:
    batch = [delta("a", "1"), delta("a", "2")]
    joined(batch)
    assert batch == [delta("a", "1"), delta("a", "2")]


def test_each_run_of_pieces_is_joined_on_its_own() -> None:
    note = NewEvent(E.TOOL_STARTED, {"toolCallId": "c"})
    batch = [delta("a", "1"), delta("a", "2"), note, delta("a", "3"), delta("a", "4")]
    assert joined(batch) == [delta("a", "12"), note, delta("a", "34")]
    assert joined([delta("a", "1"), delta("a", "2"), delta("a", None)]) == [
        delta("a", "12"),
        delta("a", None),
    ]
