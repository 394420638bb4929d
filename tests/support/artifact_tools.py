"""Tools for artifact tests: one writes through the Python API and returns the reference."""

from __future__ import annotations

import asyncio
import os

from tools.artifacts.api import ArtifactRef, save_artifact
from tools.spec import CallContext, agent_tool


@agent_tool
async def render_chart(size: int, call: CallContext, hold_s: float = 0.0) -> ArtifactRef:
    """Render a chart as PNG bytes and save it as `chart.png`, then wait `hold_s` seconds.

    The bytes are random: a re-run would write different content, so a test can tell a
    second write from a replayed one. Only the call's first execution waits.

    Args:
        size: How many bytes the chart has.
        hold_s: Seconds to wait after the artifact is stored, before returning.
    """
    chunks = (os.urandom(min(65_536, size - start)) for start in range(0, size, 65_536))
    ref = await save_artifact(call, "chart.png", chunks, metadata={"kind": "chart"})
    if call.attempt == 1:
        await asyncio.sleep(hold_s)
    return ref
