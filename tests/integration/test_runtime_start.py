"""What a started process keeps for its whole life is out of the garbage collector's walk, and
its young passes wait for more than a request's worth of objects."""

from __future__ import annotations

import gc

from server.app import build_tool_registry
from server.process import GC_YOUNG_THRESHOLD, open_runtime
from server.settings import Settings
from server.usage.registry import ModelRegistry


async def test_what_start_up_made_is_frozen_and_what_runs_make_is_not(settings: Settings) -> None:
    models = ModelRegistry(settings, {})
    async with open_runtime(
        settings, models, build_tool_registry(settings, []), run_workers=False
    ) as rt:
        made_later = {"a run's": ["objects"]}
        walked = {id(o) for o in gc.get_objects()}
        # The collector's passes walk the objects of its three generations, not the frozen.
        assert id(rt.graph) not in walked and id(rt.pool) not in walked
        assert id(made_later) in walked
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD > 700
