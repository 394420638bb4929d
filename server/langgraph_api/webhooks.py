"""Webhooks of LangGraph API runs: the run and its result POSTed once it ends, with retries.

The webhook is stored with the run; a worker claims a due delivery of a finished run with a
lease and POSTs the run (as `GET …/runs/{run_id}` shows it) with its `values` or `error`.
A 2xx answer delivers it; anything else is retried with exponential backoff (1 s doubling,
at most 5 min apart) up to `MAX_ATTEMPTS`, so a receiver may see a delivery more than once.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from server.db.pool import Pool
from server.domain import TERMINAL, status_in
from server.errors import InvalidGraphRequestError

log = logging.getLogger(__name__)
MAX_ATTEMPTS = 8
LEASE_S = 60


def check_url(url: str) -> str:
    """Return `url` if it can be a webhook (http or https), else raise."""
    if not url.startswith(("http://", "https://")):
        raise InvalidGraphRequestError(f"webhook {url!r} must be an http(s) URL")
    return url


async def add_webhook(pool: Pool, run_id: str, url: str) -> None:
    """Store the run's webhook, delivered once the run ends."""
    async with pool.connection() as conn:
        await conn.execute(
            "INSERT INTO lg_webhooks (run_id, url) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            (run_id, url),
        )


async def claim_delivery(pool: Pool) -> dict[str, Any] | None:
    """Claim one due delivery of a finished run: its run id, URL and attempt number."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "UPDATE lg_webhooks w SET attempts = attempts + 1,"
            " lease_until = now() + make_interval(secs => %(lease)s)"
            " WHERE w.run_id = (SELECT h.run_id FROM lg_webhooks h JOIN runs r ON r.id = h.run_id"
            "  WHERE h.delivered_at IS NULL AND h.next_attempt_at <= now()"
            "  AND (h.lease_until IS NULL OR h.lease_until < now())"
            f"  AND h.attempts < %(max)s AND {status_in(TERMINAL, 'r.status')}"
            "  ORDER BY h.next_attempt_at LIMIT 1 FOR UPDATE OF h SKIP LOCKED)"
            " RETURNING w.run_id, w.url, w.attempts, (SELECT tenant_id FROM runs"
            "  WHERE id = w.run_id) AS tenant_id, (SELECT user_id FROM runs"
            "  WHERE id = w.run_id) AS user_id",
            {"lease": LEASE_S, "max": MAX_ATTEMPTS},
        )
        return await cur.fetchone()


async def deliver(
    pool: Pool, http: httpx.AsyncClient, delivery: dict[str, Any], body: dict[str, Any]
) -> bool:
    """POST `body` to the delivery's URL; record the outcome; say if it was delivered."""
    error: str | None = None
    try:
        response = await http.post(delivery["url"], json=body)
        if not response.is_success:
            error = f"HTTP {response.status_code}"
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    async with pool.connection() as conn:
        if error is None:
            await conn.execute(
                "UPDATE lg_webhooks SET delivered_at = now(), lease_until = NULL,"
                " last_error = NULL WHERE run_id = %s",
                (delivery["run_id"],),
            )
            return True
        delay = min(300, 2 ** (delivery["attempts"] - 1))
        await conn.execute(
            "UPDATE lg_webhooks SET lease_until = NULL, last_error = %s,"
            " next_attempt_at = now() + make_interval(secs => %s) WHERE run_id = %s",
            (error, delay, delivery["run_id"]),
        )
    log.info("webhook of run %s not delivered (%s)", delivery["run_id"], error)
    return False
