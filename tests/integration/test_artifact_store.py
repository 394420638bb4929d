"""Artifacts through both storage backends: streamed, exact, once per call, by tenant, pruned."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator

import pytest

from server.artifacts.records import Owner, begin_version
from server.artifacts.retention import prune_artifacts
from server.artifacts.service import ArtifactService
from server.artifacts.storage import LocalStorage, Storage, make_storage
from server.artifacts.writer import RunArtifacts
from server.auth import Principal
from server.db.pool import Pool
from server.domain import Run
from server.errors import ArtifactNotFoundError, RangeNotSatisfiableError, RunNotFoundError
from server.runs.conversations import create_conversation
from server.runs.records import create_run, get_run
from server.settings import Settings
from tests.support.s3 import make_bucket, s3_server, s3_settings
from tools.artifacts.api import ArtifactWrite, chunks_of

pytestmark = pytest.mark.timeout(180)
WHO = Principal("acme", "ann")
OTHER = Principal("globex", "gus")
MIB = 1024 * 1024


@pytest.fixture(scope="module")
async def s3_endpoint() -> AsyncIterator[str]:
    async with s3_server() as endpoint:
        yield endpoint


@pytest.fixture(scope="module", params=["local", "s3"])
def storage(
    request: pytest.FixtureRequest,
    settings: Settings,
    tmp_path_factory: pytest.TempPathFactory,
    s3_endpoint: str,
) -> Storage:
    if request.param == "local":
        return LocalStorage(tmp_path_factory.mktemp("artifacts"))
    make_bucket(s3_endpoint, "artifacts-it")
    return make_storage(s3_settings(settings, s3_endpoint, "artifacts-it"))


async def new_run(pool: Pool, who: Principal = WHO) -> Run:
    conv = (await create_conversation(pool, who, None, None, {}))["id"]
    created = await create_run(pool, who, conv, "write things", "demo", {})
    async with pool.connection() as conn:
        return await get_run(conn, who, created.id)


def sink(pool: Pool, storage: Storage, run: Run) -> RunArtifacts:
    return RunArtifacts(pool, storage, run, max_bytes=100 * MIB)


def request(name: str, key: str, media_type: str = "text/plain") -> ArtifactWrite:
    return ArtifactWrite(
        tool_call_id=f"call_{key}", idempotency_key=key, name=name, media_type=media_type
    )


async def read_all(
    service: ArtifactService, artifact_id: str, version: int | None = None, span: str | None = None
) -> bytes:
    download = await service.content(WHO, artifact_id, version, span)
    return b"".join([chunk async for chunk in download.body])


async def test_content_over_several_parts_reads_back_byte_identical(
    pool: Pool, storage: Storage
) -> None:
    run = await new_run(pool)
    data = os.urandom(12 * MIB + 12345)  # three multipart parts of 5 MiB on S3
    ref = await sink(pool, storage, run).write(
        request("data.bin", f"k-{id(storage)}-big", "application/octet-stream"), chunks_of(data)
    )
    assert (ref.version, ref.size, ref.created) == (1, len(data), True)
    assert ref.checksum == f"sha256:{hashlib.sha256(data).hexdigest()}"
    service = ArtifactService(pool, storage, url_ttl_s=60)
    assert await read_all(service, ref.id) == data
    listed = await service.list_for_run(WHO, run.id)
    assert [(a.name, a.latest_version) for a in listed] == [("data.bin", 1)]


async def test_a_call_run_again_finds_its_version_and_a_new_call_adds_one(
    pool: Pool, storage: Storage
) -> None:
    run = await new_run(pool)
    artifacts = sink(pool, storage, run)
    key = f"k-{id(storage)}-again"
    first = await artifacts.write(request("notes.md", key), chunks_of("# v1\n"))
    again = await artifacts.write(request("notes.md", key), chunks_of("# v1, re-run\n"))
    assert (again.id, again.version, again.replayed) == (first.id, 1, True)
    second = await artifacts.write(request("notes.md", key + "-2"), chunks_of("# v2\n"))
    assert (second.id, second.version, second.created) == (first.id, 2, False)

    service = ArtifactService(pool, storage, url_ttl_s=60)
    artifact = await service.get(WHO, first.id)
    assert [v.version for v in artifact.versions] == [1, 2]
    assert await read_all(service, first.id, 1) == b"# v1\n"
    assert await read_all(service, first.id) == b"# v2\n"


async def test_a_write_cut_off_before_it_finished_is_completed_by_the_rerun(
    pool: Pool, storage: Storage
) -> None:
    run = await new_run(pool)
    key = f"k-{id(storage)}-crash"
    owner = Owner(run.tenant_id, run.user_id, run.conversation_id, run.id)
    begun = await begin_version(
        pool,
        owner,
        name="cut.txt",
        tool_call_id="c",
        idempotency_key=key,
        media_type="text/plain",
        metadata={},
    )
    assert begun.status == "writing"
    service = ArtifactService(pool, storage, url_ttl_s=60)
    assert await service.list_for_run(WHO, run.id) == []  # not visible until stored

    ref = await sink(pool, storage, run).write(request("cut.txt", key), chunks_of("whole"))
    assert (ref.id, ref.version, ref.replayed) == (begun.artifact_id, 1, False)
    assert await read_all(service, ref.id) == b"whole"
    assert len((await service.get(WHO, ref.id)).versions) == 1


async def test_ranges_and_another_tenant(pool: Pool, storage: Storage) -> None:
    run = await new_run(pool)
    ref = await sink(pool, storage, run).write(
        request("abc.txt", f"k-{id(storage)}-range"), chunks_of("abcdefghij")
    )
    service = ArtifactService(pool, storage, url_ttl_s=60)
    part = await service.content(WHO, ref.id, None, "bytes=2-4")
    assert (part.status, part.headers["Content-Range"]) == (206, "bytes 2-4/10")
    assert b"".join([c async for c in part.body]) == b"cde"
    assert await read_all(service, ref.id, span="bytes=-3") == b"hij"
    assert await read_all(service, ref.id, span="bytes=7-") == b"hij"
    assert await read_all(service, ref.id, span="items=1-2") == b"abcdefghij"
    with pytest.raises(RangeNotSatisfiableError):
        await service.content(WHO, ref.id, None, "bytes=10-")
    with pytest.raises(ArtifactNotFoundError):
        await service.version(WHO, ref.id, 2)

    with pytest.raises(ArtifactNotFoundError):
        await service.get(OTHER, ref.id)
    with pytest.raises(ArtifactNotFoundError):
        await service.content(OTHER, ref.id, None, None)
    with pytest.raises(RunNotFoundError):
        await service.list_for_run(OTHER, run.id)
    url = await service.signed_url(WHO, ref.id, None)
    assert url["direct"] is storage.signs_urls


async def test_prune_deletes_versions_past_their_tenants_retention(
    pool: Pool, storage: Storage, settings: Settings
) -> None:
    run, kept_run = await new_run(pool), await new_run(pool, OTHER)
    old = await sink(pool, storage, run).write(
        request("old.txt", f"k-{id(storage)}-old"), chunks_of("old")
    )
    new = await sink(pool, storage, run).write(
        request("old.txt", f"k-{id(storage)}-new"), chunks_of("new")
    )
    kept = await sink(pool, storage, kept_run).write(
        request("kept.txt", f"k-{id(storage)}-kept"), chunks_of("kept")
    )
    async with pool.connection() as conn:
        await conn.execute(
            "UPDATE artifact_versions SET created_at = now() - interval '40 days'"
            " WHERE (artifact_id = %s AND version = 1) OR artifact_id = %s",
            (old.id, kept.id),
        )
    policy = settings.model_copy(
        update={"artifact_retention_days": 30.0, "artifact_retention_by_tenant": {"globex": None}}
    )
    assert await prune_artifacts(pool, storage, policy) >= 1

    service = ArtifactService(pool, storage, url_ttl_s=60)
    artifact = await service.get(WHO, new.id)
    assert [v.version for v in artifact.versions] == [2]
    assert await read_all(service, new.id) == b"new"
    assert (await service.get(OTHER, kept.id)).latest_version == 1
    if isinstance(storage, LocalStorage):
        gone = storage.path_of(f"acme/{old.id}/k-{id(storage)}-old")
        assert not await asyncio.to_thread(gone.exists)
