"""Liveness and readiness probes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from server.db.pool import ping
from server.deps import NotifierDep, PoolDep
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
async def readyz(pool: PoolDep, notifier: NotifierDep) -> dict[str, Any] | JSONResponse:
    """Say whether the database answers and live notifications are connected."""
    checks: dict[str, Any] = {}
    try:
        await ping(pool, timeout_s=2)
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"error: {exc}"
    checks["notifications"] = "ok" if notifier.connected.is_set() else "down"
    ready = all(v == "ok" for v in checks.values())
    body = {"status": "ready" if ready else "not ready", "checks": checks}
    return body if ready else JSONResponse(body, status_code=503)
