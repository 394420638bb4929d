"""`agentrt db prune` applies the artifact retention: old versions go, bytes first."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from server.artifacts.service import ArtifactService
from server.artifacts.storage import LocalStorage
from server.artifacts.writer import RunArtifacts
from server.auth import Principal
from server.db.pool import Pool
from server.errors import ArtifactNotFoundError
from server.runs.conversations import create_conversation
from server.runs.records import create_run, get_run
from tests.support.processes import ROOT, worker_env
from tools.artifacts.api import ArtifactWrite, chunks_of

pytestmark = pytest.mark.timeout(240)


async def write(pool: Pool, storage: LocalStorage, who: Principal, key: str) -> str:
    conv = (await create_conversation(pool, who, None, None, {}))["id"]
    created = await create_run(pool, who, conv, "write", "demo", {})
    async with pool.connection() as conn:
        run = await get_run(conn, who, created.id)
    sink = RunArtifacts(pool, storage, run, max_bytes=1 << 20)
    ref = await sink.write(ArtifactWrite("c1", key, "old.txt", "text/plain"), chunks_of("old"))
    return ref.id


async def test_db_prune_deletes_artifact_versions_past_the_tenants_retention(
    pool: Pool, database_url: str, tmp_path: Path
) -> None:
    storage = LocalStorage(tmp_path / "store")
    acme, globex = Principal("acme", "ann"), Principal("globex", "gus")
    old = await write(pool, storage, acme, "prune-cli-acme")
    kept = await write(pool, storage, globex, "prune-cli-globex")
    async with pool.connection() as conn:
        await conn.execute("UPDATE artifact_versions SET created_at = now() - interval '10 days'")

    env = worker_env(
        database_url,
        data_dir=str(tmp_path / "data"),
        artifact_dir=str(tmp_path / "store"),
        artifact_retention_days=7,
        artifact_retention_by_tenant={"globex": None},
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "server.cli",
        "db",
        "prune",
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0, out.decode()
    assert "deleted 1 artifact versions past their retention" in out.decode()

    service = ArtifactService(pool, storage, url_ttl_s=60)
    with pytest.raises(ArtifactNotFoundError):
        await service.get(acme, old)
    assert not await asyncio.to_thread(storage.path_of(f"acme/{old}/prune-cli-acme").exists)
    assert (await service.get(globex, kept)).latest_version == 1
