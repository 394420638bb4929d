"""Every benchmark `make bench` and `make bench-large` run can be loaded.

`bench/run.py` imports each one as its turn comes: a name a benchmark imports that the
server no longer has would stop a full run there, after the benchmarks before it.
"""

from __future__ import annotations

import importlib

import pytest

from bench.run import BENCHMARKS, LARGE


@pytest.mark.parametrize("name", BENCHMARKS + LARGE)
def test_a_benchmark_loads_and_has_its_entry_point(name: str) -> None:
    module = importlib.import_module(f"bench.{name}")
    assert callable(module.main)
