"""Run a CPU-heavy tool in a separate process that is killed when its caller stops waiting.

A thread does not protect the server from CPU-bound work: a single big-integer operation or
regular-expression match holds the GIL until it ends, so the event loop (lease heartbeats, the
API) stalls with it, and a timed-out thread runs on. A process can be killed: when the await
is cancelled (the tool's `asyncio.timeout`, a cancelled run) the child gets SIGKILL.

Children fork from a multiprocessing forkserver started once per process (clean: it has no
threads to inherit), so a call costs a fork rather than an interpreter start. The child
imports the tool by module and name, so a CPU-heavy tool must be defined at module level.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import multiprocessing
import threading
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from langchain_core.tools import BaseTool, ToolException

from tools.spec import ToolSpec

_CONTEXT = multiprocessing.get_context("forkserver")
# Modules every child needs (langchain-core imports its tracers on a tool's first call),
# imported once in the forkserver instead of in each child.
_CONTEXT.set_forkserver_preload(
    [
        "tools.isolation",
        "tools.calculator",
        "langchain_core.tracers.langchain",
        "langchain_core.tracers.stdout",
        "langchain_core.tracers.run_collector",
        "langsmith.run_helpers",
    ]
)


def _nothing() -> None:
    """Do nothing (in a child, to see the forkserver answer)."""


_started = threading.Lock()
_ready = False


def ensure_forkserver() -> None:
    """Start the forkserver unless this process did, and wait until it serves forks.

    Blocking: the forkserver imports its preloads (seconds on a busy machine) before it
    serves a fork, so this forks one child that does nothing and waits for it, once.
    """
    global _ready
    with _started:
        if _ready:
            return
        child = _CONTEXT.Process(target=_nothing, name="forkserver warm-up")
        child.start()
        child.join()
        child.close()
        _ready = True


async def forkserver_ready() -> None:
    """Wait until the forkserver serves forks (at once, after this process's first wait)."""
    if not _ready:
        await asyncio.to_thread(ensure_forkserver)


def tool_reference(tool: BaseTool) -> tuple[str, str]:
    """Return the module and qualified name a child process imports `tool` by.

    Raises:
        ValueError: the tool's function is not defined at module level.
    """
    fn = getattr(tool, "func", None) or getattr(tool, "coroutine", None)
    if fn is None or "<locals>" in fn.__qualname__:
        raise ValueError(
            f"tool {tool.name!r} cannot run in a separate process: its function must be "
            "defined at module level"
        )
    return fn.__module__, fn.__qualname__


def resolve(module: str, qualname: str) -> BaseTool:
    """Import the tool that `tool_reference` named (a ToolSpec's tool, or a BaseTool)."""
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    if isinstance(found, ToolSpec):
        found = found.tool
    if not isinstance(found, BaseTool):
        raise TypeError(f"{module}:{qualname} is {type(found).__name__}, not a tool")
    return found


def _child(module: str, qualname: str, payload: dict[str, Any], conn: Connection) -> None:
    """Run the tool and send ("ok", value) or ("error", exception) back."""
    message: tuple[str, Any]
    try:
        tool = resolve(module, qualname)
        if getattr(tool, "coroutine", None) is not None:
            value = asyncio.run(tool.ainvoke(payload))
        else:
            value = tool.invoke(payload)
        message = ("ok", value)
    except BaseException as exc:  # every failure goes back to the caller to classify
        message = ("error", exc)
    try:
        conn.send(message)
    except OSError:  # the caller stopped waiting and closed its end
        return
    except Exception as exc:  # the value or the exception cannot be pickled
        what = "result" if message[0] == "ok" else f"error ({message[1]!r})"
        with contextlib.suppress(OSError):
            conn.send(("error", ToolException(f"the tool's {what} cannot be sent back: {exc}")))
    conn.close()


def _reap(process: BaseProcess) -> None:
    """Kill the child if it still runs, wait for it, release its resources (blocking)."""
    if process.pid is None:  # it never started
        return
    if process.is_alive():
        process.kill()
    process.join(30)
    if process.exitcode is not None:
        process.close()


async def _readable(*fds: int) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    for fd in fds:
        loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        for fd in fds:
            loop.remove_reader(fd)


async def run_in_process(tool: BaseTool, payload: dict[str, Any]) -> Any:
    """Invoke `tool` with `payload` in a child process; kill the child if cancelled.

    Returns:
        What the tool returned.

    Raises:
        Exception: what the tool raised, or a ToolException if its process died.
    """
    module, qualname = tool_reference(tool)
    receive, send = _CONTEXT.Pipe(duplex=False)
    process = _CONTEXT.Process(
        target=_child, args=(module, qualname, payload, send), name=f"tool {tool.name}"
    )
    loop = asyncio.get_running_loop()
    # Starting blocks (the first call starts the forkserver), so it runs in a thread.
    starting = loop.run_in_executor(None, process.start)

    def finish(started: asyncio.Future[None] | None = None) -> None:
        if started is not None and not started.cancelled():
            started.exception()  # retrieved here: the caller stopped waiting for it
        send.close()
        receive.close()
        try:
            loop.run_in_executor(None, _reap, process)
        except RuntimeError:  # the loop is shutting down: reap here
            _reap(process)

    answer: tuple[str, Any] | None = None
    try:
        await asyncio.shield(starting)
        send.close()
        await _readable(receive.fileno(), process.sentinel)
        if receive.poll():
            with contextlib.suppress(EOFError):
                answer = receive.recv()
        if answer is None:
            await loop.run_in_executor(None, process.join, 30)
            exit_code = process.exitcode
    finally:
        if starting.done():
            finish()
        else:
            starting.add_done_callback(finish)
    if answer is None:
        raise ToolException(
            f"{tool.name} stopped without an answer (process exit code {exit_code})"
        )
    status, value = answer
    if status == "error":
        raise value if isinstance(value, BaseException) else ToolException(str(value))
    return value
