"""Liveness and readiness probes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from server.routes.schemas import Health, Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
async def healthz() -> dict[str, str]:
    """Say the process is up."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "Not ready; `checks` says why."}},
)
async def readyz(request: Request) -> dict[str, Any] | JSONResponse:
    """Say whether the database answers and live notifications are connected."""
    checks: dict[str, Any] = {}
    try:
        async with request.app.state.pool.connection(timeout=2) as conn:
            await conn.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"error: {exc}"
    checks["notifications"] = "ok" if request.app.state.notifier.connected.is_set() else "down"
    ready = all(v == "ok" for v in checks.values())
    body = {"status": "ready" if ready else "not ready", "checks": checks}
    return body if ready else JSONResponse(body, status_code=503)
