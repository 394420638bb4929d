"""Metadata for the model calls a node makes, so their trace spans can link their manifest."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from langchain_core.runnables.config import var_child_runnable_config

STEP_KEY = "agentrt_step"
PURPOSE_KEY = "agentrt_purpose"


@contextmanager
def call_metadata(**values: Any) -> Iterator[None]:
    """Add `values` to the metadata of every LangChain call made inside the block.

    Chat models read the node's config from this context variable when called without one,
    and hand its metadata to the callbacks (and so to the trace).
    """
    config = var_child_runnable_config.get() or {}
    metadata = {**(config.get("metadata") or {}), **values}
    token = var_child_runnable_config.set({**config, "metadata": metadata})
    try:
        yield
    finally:
        var_child_runnable_config.reset(token)
