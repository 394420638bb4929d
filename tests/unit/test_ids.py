from __future__ import annotations

import re

from server.ids import new_id


def test_ids_made_in_a_burst_sort_in_the_order_they_were_made() -> None:
    ids = [new_id("run") for _ in range(5000)]  # many share a millisecond
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_an_id_is_its_prefix_and_32_hex_digits() -> None:
    assert re.fullmatch(r"run_[0-9a-f]{32}", new_id("run"))
