"""LangGraph API: runs on threads and stateless, their streams, waits and cancels.

Every stream is resumable: `GET …/runs/{run_id}/stream` with `Last-Event-ID` replays from
the run's event log, during the run and after it (docs/langgraph.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Body, Header, Query, Response
from fastapi.responses import StreamingResponse

from server.deps import LangGraphDep
from server.langgraph_api.bodies import (
    MAX_OFFSET,
    CancelMany,
    RunCreate,
    StreamMode,
    ThreadStreamMode,
)
from server.routes.guards import CleanText
from server.routes.schemas import BODY_ERRORS, COMMON_ERRORS, errors

LANGGRAPH_ERRORS = {**COMMON_ERRORS, **BODY_ERRORS, **errors(403, 404, 409)}
router = APIRouter(tags=["langgraph: runs"], responses=LANGGRAPH_ERRORS)
SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


def _path(*segments: str) -> str:
    """A path for a `Location` header: each id percent-encoded, as headers carry only Latin-1."""
    return "".join(f"/{quote(s, safe='')}" for s in segments)


def _places(run: dict[str, Any]) -> tuple[str, str]:
    base = _path("threads", run["thread_id"], "runs", run["run_id"])
    return base, f"{base}/stream"


def _created(run: dict[str, Any], response: Response) -> dict[str, Any]:
    response.headers["Content-Location"] = _places(run)[0]
    return run


async def _stream(lg: LangGraphDep, run: dict[str, Any], body: dict[str, Any]) -> Response:
    frames = await lg.stream(run["run_id"], last_event_id=None)
    cancel = body.get("on_disconnect") == "cancel"

    async def watched() -> AsyncIterator[str]:
        finished = False
        try:
            async for frame in frames:
                yield frame
            finished = True
            await lg.delivered(run["run_id"])
        finally:
            if cancel and not finished:
                await (await lg.runs("update")).cancel_many(
                    {"run_ids": [run["run_id"]]}, "interrupt"
                )

    base, stream = _places(run)
    headers = {**SSE_HEADERS, "Location": stream, "Content-Location": base}
    return StreamingResponse(watched(), media_type="text/event-stream", headers=headers)


def _waiting(lg: LangGraphDep, run: dict[str, Any]) -> Response:
    base, _ = _places(run)
    headers = {"Location": f"{base}/join", "Content-Location": base}
    return StreamingResponse(
        lg.waiting(run["run_id"]), media_type="application/json", headers=headers
    )


@router.post("/threads/{thread_id}/runs")
async def create(
    lg: LangGraphDep,
    thread_id: str,
    sent: Annotated[RunCreate, CleanText, Body()],
    response: Response,
) -> dict[str, Any]:
    """Queue a run on the thread (a background run)."""
    body = sent.data()
    return _created(await (await lg.runs("create_run", body)).create(thread_id, body), response)


@router.post("/runs")
async def create_stateless(
    lg: LangGraphDep, sent: Annotated[RunCreate, CleanText, Body()], response: Response
) -> dict[str, Any]:
    """Queue a run on a new thread."""
    body = sent.data()
    return _created(await (await lg.runs("create_run", body)).create(None, body), response)


@router.post("/threads/{thread_id}/runs/stream")
async def stream(
    lg: LangGraphDep, thread_id: str, sent: Annotated[RunCreate, CleanText, Body()]
) -> Response:
    """Queue a run on the thread and stream it (`metadata` first)."""
    body = sent.data()
    return await _stream(
        lg, await (await lg.runs("create_run", body)).create(thread_id, body), body
    )


@router.post("/runs/stream")
async def stream_stateless(
    lg: LangGraphDep, sent: Annotated[RunCreate, CleanText, Body()]
) -> Response:
    """Queue a run on a new thread and stream it."""
    body = sent.data()
    return await _stream(lg, await (await lg.runs("create_run", body)).create(None, body), body)


@router.post("/threads/{thread_id}/runs/wait")
async def wait(
    lg: LangGraphDep, thread_id: str, sent: Annotated[RunCreate, CleanText, Body()]
) -> Response:
    """Queue a run on the thread and answer its final values when it ends."""
    body = sent.data()
    return _waiting(lg, await (await lg.runs("create_run", body)).create(thread_id, body))


@router.post("/runs/wait")
async def wait_stateless(
    lg: LangGraphDep, sent: Annotated[RunCreate, CleanText, Body()]
) -> Response:
    """Queue a run on a new thread and answer its final values when it ends."""
    body = sent.data()
    return _waiting(lg, await (await lg.runs("create_run", body)).create(None, body))


@router.post("/runs/batch")
async def create_batch(
    lg: LangGraphDep, sent: Annotated[list[RunCreate], CleanText, Body(max_length=100)]
) -> list[dict[str, Any]]:
    """Queue several runs, each on a new thread."""
    bodies = [one.data() for one in sent]
    return [await (await lg.runs("create_run", one)).create(None, one) for one in bodies]


@router.post("/runs/cancel", status_code=204)
async def cancel_many(
    lg: LangGraphDep, sent: Annotated[CancelMany, CleanText, Body()], action: str = "interrupt"
) -> Response:
    """Cancel runs by `run_ids`, or a thread's runs by `status`."""
    body = sent.data()
    await (await lg.runs("update", body)).cancel_many(body, action)
    return Response(status_code=204)


@router.get("/threads/{thread_id}/runs")
async def list_runs(
    lg: LangGraphDep,
    thread_id: str,
    limit: Annotated[int, Query(ge=1, le=1000)] = 10,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
    status: str | None = None,
) -> list[dict[str, Any]]:
    """List the thread's runs, newest first."""
    return await (await lg.runs("read")).list(thread_id, limit, offset, status)


@router.get("/threads/{thread_id}/runs/{run_id}")
async def get(lg: LangGraphDep, thread_id: str, run_id: str) -> dict[str, Any]:
    """Return a run."""
    return await (await lg.runs("read")).view(thread_id, run_id)


@router.delete("/threads/{thread_id}/runs/{run_id}", status_code=204)
async def delete(lg: LangGraphDep, thread_id: str, run_id: str) -> Response:
    """Delete a finished run."""
    await (await lg.runs("delete")).delete(thread_id, run_id)
    return Response(status_code=204)


@router.get("/threads/{thread_id}/runs/{run_id}/join")
async def join(lg: LangGraphDep, thread_id: str, run_id: str) -> Response:
    """Wait for the run to end; answer the thread's values (or the run's `__error__`)."""
    return _waiting(lg, await (await lg.runs("read")).view(thread_id, run_id))


@router.get("/threads/{thread_id}/runs/{run_id}/stream")
async def join_stream(
    lg: LangGraphDep,
    thread_id: str,
    run_id: str,
    # The SDK sends `stream_mode=` (empty) for none.
    stream_mode: Annotated[list[StreamMode | Literal[""]] | None, Query()] = None,
    last_event_id: Annotated[str | None, Header()] = None,
) -> Response:
    """Stream the run from its start, or after `Last-Event-ID`, live until it ends."""
    frames = await lg.stream(
        run_id, last_event_id=last_event_id, modes=stream_mode, thread_id=thread_id
    )
    base = _path("threads", thread_id, "runs", run_id)
    headers = {**SSE_HEADERS, "Location": f"{base}/stream", "Content-Location": base}
    return StreamingResponse(frames, media_type="text/event-stream", headers=headers)


@router.post("/threads/{thread_id}/runs/{run_id}/cancel", status_code=204)
async def cancel(
    lg: LangGraphDep,
    thread_id: str,
    run_id: str,
    wait: bool = False,
    action: Literal["interrupt", "rollback"] = "interrupt",
) -> Response:
    """Cancel the run (`action=rollback` also removes what it wrote to the thread)."""
    await (await lg.runs("update")).cancel(thread_id, run_id, wait=wait, action=action)
    return Response(status_code=204)


@router.get("/threads/{thread_id}/stream")
async def join_thread_stream(
    lg: LangGraphDep,
    thread_id: str,
    stream_mode: Annotated[list[ThreadStreamMode] | None, Query()] = None,
    last_event_id: Annotated[
        str,
        Header(
            description="The id of the last frame the client has: `<run_id>:<seq>` or "
            "`<run_id>:end`, a run of this thread.",
            json_schema_extra={"pattern": "^(.+:([0-9]+|end))?$"},
        ),
    ] = "",
) -> Response:
    """Stream the thread's runs as they come (`run_done` after each), after `Last-Event-ID`."""
    frames = await lg.thread_stream(thread_id, last_event_id=last_event_id, modes=stream_mode)
    headers = {**SSE_HEADERS, "Location": _path("threads", thread_id, "stream")}
    return StreamingResponse(frames, media_type="text/event-stream", headers=headers)
