"""Which worker a queued run's notification is for, so that idle workers do not all claim it.

Every worker process listens on the runs channel. Without a ticket, each one with a free slot
answers every queued notification with a claim; one wins and the others find nothing, so an
idle fleet of N workers pays N claims (N transactions behind the claims' lock) for each run.

A run that becomes queued is notified as `queued:<run id>`, a ticket. The worker it names is
the one at the ticket's rank among the live workers (`workers` rows not draining, with a
heartbeat within a lease), ranked by id, which every worker reads at each heartbeat. What each
worker does with a ticket (`Worker._on_queued`):

- The named worker answers it, as any worker answers a plain `queued`.
- A worker running runs of its own answers every ticket: at load the least busy worker's
  event loop gets to its claim first, and the runs go to the workers with time for them.
- An idle worker leaves another worker's ticket to it. After a grace
  (`AGENTRT_WORKER_TICKET_GRACE_S`, 0.25 s) it looks whether any run it left is still queued
  (one read by primary key for all of them), and claims if one is: the named worker may be
  full, draining or gone (killed since the others last read the `workers` rows), or no
  worker may be named in anyone's view (one that joined since). So a ticket delays no run by
  more than the grace, and a burst of tickets costs an idle worker one look per grace, not a
  claim per run (docs/decisions/2055).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from server.db.pool import Conn
from server.domain import in_phase

# The workers a ticket may name: registered, not draining, heard from within a lease.
LIVE_WORKERS_SQL = (
    "SELECT id FROM workers WHERE NOT draining"
    " AND last_heartbeat_at > now() - make_interval(secs => %s) ORDER BY id"
)


def named_worker(run_id: str, live: Sequence[str]) -> str | None:
    """The worker of `live` (ranked by id) that a ticket for `run_id` names; None if none."""
    if not live:
        return None
    return live[zlib.crc32(run_id.encode()) % len(live)]


async def live_workers(conn: Conn, lease_seconds: float) -> list[str]:
    """Ids of the workers tickets are shared among, ranked."""
    cur = await conn.execute(LIVE_WORKERS_SQL, (lease_seconds,))
    return [row["id"] for row in await cur.fetchall()]


async def any_queued(conn: Conn, run_ids: set[str]) -> bool:
    """Whether any of `run_ids` is still queued."""
    cur = await conn.execute(
        f"SELECT EXISTS (SELECT FROM runs WHERE id = ANY(%s) AND {in_phase('queued')}) AS queued",
        (list(run_ids),),
    )
    row = await cur.fetchone()
    return bool(row and row["queued"])
