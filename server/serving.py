"""The API server process: uvicorn with a drain that says what it does and can be hurried."""

from __future__ import annotations

import asyncio
import socket
from types import FrameType

import uvicorn
from fastapi import FastAPI


class DrainingServer(uvicorn.Server):
    """Uvicorn, stopping the way an operator expects.

    The first SIGINT or SIGTERM logs how many runs are draining and for how long, ends open
    event streams (clients resume elsewhere with Last-Event-ID) and lets runs stop at their next
    step; a second one hands every run back to the queue at once, still through the app's
    orderly shutdown (uvicorn's own second-signal exit skips it, and the cancelled clean-up
    prints tracebacks); a third exits without it. Uvicorn's handler also re-raises the signal
    after shutdown, which prints a KeyboardInterrupt traceback; this one exits quietly.
    """

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signals = 0

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        """Serve until told to stop (see the class docstring)."""
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Drain on the first signal, hand runs back on the second, exit at once on the third."""
        self._signals += 1
        runtime = getattr(self._app.state, "runtime", None)
        if runtime is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(runtime.request_stop)
        self.should_exit = True
        if self._signals >= 3:
            self.force_exit = True
