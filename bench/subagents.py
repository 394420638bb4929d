"""Parents waiting on slow children hold no worker slot: who holds the slots while they wait.

Each parent delegates one task to a slow child (a scripted answer streamed over about four
seconds) and answers once it is back. All parents are posted at once to two worker
processes with 10 slots each, far fewer slots than parents, so most parents wait while
children queue for slots. The database is sampled every 100 ms: leased parents, leased
children, and parents waiting unleased.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from bench.common import (
    Figures,
    env_for,
    http,
    processes,
    run_async,
    start_api,
    start_workers,
    write_scripts,
)

CHILD = {"text": "slow " * 80, "chunk_chars": 5, "delay_s": 0.05}
SCRIPTS = {
    "parent": [
        {"tool_calls": [{"name": "delegate", "args": {"task": "slow work", "agent": "slow"}}]},
        {"text": "done"},
    ],
    "slow": [CHILD],
}
WORKERS, SLOTS = 2, 10
_SAMPLE = """
SELECT
  count(*) FILTER (WHERE parent_run_id IS NULL AND lease_owner IS NOT NULL
                   AND status IN ('running', 'waiting_tool')) AS parents_leased,
  count(*) FILTER (WHERE parent_run_id IS NOT NULL AND lease_owner IS NOT NULL
                   AND status IN ('running', 'waiting_tool')) AS children_leased,
  count(*) FILTER (WHERE parent_run_id IS NULL AND lease_owner IS NULL
                   AND status = 'waiting_tool') AS parents_waiting,
  count(*) FILTER (WHERE parent_run_id IS NULL AND lease_owner IS NOT NULL
                   AND status = 'waiting_tool') AS waiting_parents_leased,
  count(*) FILTER (WHERE parent_run_id IS NULL AND status = 'completed') AS parents_done
FROM runs
"""


async def _sample(database_url: str, stop: asyncio.Event) -> list[dict[str, Any]]:
    samples = []
    async with await psycopg.AsyncConnection.connect(
        database_url, autocommit=True, row_factory=dict_row
    ) as conn:
        while not stop.is_set():
            cur = await conn.execute(_SAMPLE)
            row = await cur.fetchone()
            assert row is not None
            samples.append(dict(row))
            await asyncio.sleep(0.1)
    return samples


async def _scenario(url: str, database_url: str, parents: int) -> dict[str, Any]:
    async with http(url) as client:
        for name, tools in (("parent", ["delegate"]), ("slow", [])):
            body = {"name": name, "model": f"scripted:{name}", "tools": tools}
            (await client.post("/api/agents", json=body)).raise_for_status()
        stop = asyncio.Event()
        sampler = asyncio.create_task(_sample(database_url, stop))
        started = time.perf_counter()

        async def post() -> str:
            conv = (await client.post("/api/conversations", json={"agent": "parent"})).json()
            answer = await client.post(
                f"/api/conversations/{conv['conversationId']}/messages", json={"content": "go"}
            )
            answer.raise_for_status()
            return str(answer.json()["runId"])

        # All at once: every parent is queued before any child, so parents are claimed first.
        ids = await asyncio.gather(*(post() for _ in range(parents)))
        while True:
            done = 0
            for run_id in ids:
                status = (await client.get(f"/api/runs/{run_id}")).json()["status"]
                done += status in ("completed", "failed", "cancelled")
            if done == len(ids):
                break
            await asyncio.sleep(0.5)
        took = time.perf_counter() - started
        stop.set()
        samples = await sampler
        statuses = [(await client.get(f"/api/runs/{r}")).json()["status"] for r in ids]
    return {"samples": samples, "took": took, "completed": statuses.count("completed")}


def main(database_url: str, quick: bool) -> Figures:
    """Post parents that each wait on a slow child; report who holds the worker slots."""
    figures = Figures(
        "Subagents: 100 parents waiting on slow children", "make bench (bench/subagents.py)"
    )
    parents = 20 if quick else 100
    folder = Path(tempfile.mkdtemp(prefix="agentrt-bench-subagents-"))
    env = env_for(
        database_url,
        scripted_models_file=str(write_scripts(folder, SCRIPTS)),
        user_max_active_runs=500,
        tenant_max_active_runs=500,
        worker_poll_seconds=0.5,
    )
    api = start_api(env)
    assert api.url is not None
    with processes([api, *start_workers(env, WORKERS, SLOTS)]):
        result = run_async(_scenario(api.url, database_url, parents))
    samples = result["samples"]
    busy = [s for s in samples if s["parents_waiting"] >= parents // 2]
    most = max(samples, key=lambda s: s["parents_waiting"])

    def spread(key: str) -> str:
        values = sorted(s[key] for s in busy)
        return f"{statistics.median(values):.0f} / {values[-1]}" if values else "-"

    figures.add(
        f"{parents} parents, {WORKERS} worker processes x {SLOTS} slots; each child streams "
        "80 chunks 50 ms apart. Sampled every 100 ms."
    )
    figures.add("")
    figures.add("| measure | value |")
    figures.add("|---|---|")
    figures.add(f"| parents waiting for their child at once (max) | {most['parents_waiting']} |")
    figures.add(
        "| waiting parents holding a worker slot (max, any sample) | "
        f"{max(s['waiting_parents_leased'] for s in samples)} |"
    )
    figures.add(
        f"| samples with ≥ {parents // 2} parents waiting | {len(busy)} of {len(samples)} |"
    )
    figures.add(
        f"| in those samples, slots held by children (median / max of {WORKERS * SLOTS}) | "
        f"{spread('children_leased')} |"
    )
    figures.add(
        "| in those samples, slots held by parents running their own turns (median / max) | "
        f"{spread('parents_leased')} |"
    )
    figures.add(f"| parents completed | {result['completed']} of {parents} |")
    figures.add(f"| wall time, first post to last parent done | {result['took']:.1f} s |")
    return figures
