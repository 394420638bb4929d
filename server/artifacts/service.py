"""What the API and `agentrt artifacts` ask of artifacts: listings, records and content.

Every read is scoped by the caller's tenant: another tenant's artifact is answered as not
found, exactly like an artifact that does not exist.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from server.artifacts.records import Artifact, Version, artifact_ids_of_runs, load_artifacts
from server.artifacts.storage import Storage, content_disposition
from server.artifacts.writer import content_link
from server.auth import Principal
from server.db.pool import Conn, Pool
from server.domain import Run
from server.errors import ArtifactNotFoundError, RangeNotSatisfiableError
from server.runs.records import get_run
from server.subagents.usage import subtree
from server.timestamps import iso

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


@dataclass(frozen=True)
class Download:
    """The content of one version, or the part a `Range` asked for, ready to stream."""

    version: Version
    start: int
    end: int  # inclusive; -1 for empty content
    body: AsyncIterator[bytes]
    partial: bool
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def status(self) -> int:
        """200 for the whole content, 206 for a range."""
        return 206 if self.partial else 200


async def runs_in_listing(conn: Conn, run: Run) -> list[str]:
    """Return the runs whose artifacts a run's listing shows: the run and its descendants.

    What a subagent (a child run, at any depth) writes is part of its parent's work.
    """
    return [row["id"] for row in await subtree(conn, run.id)]


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """Return the inclusive byte range a `Range` header asks for (None: the whole content).

    A header this server does not serve (several ranges, another unit, bad syntax) is
    ignored, as RFC 9110 allows: the whole content is sent.

    Raises:
        RangeNotSatisfiableError: the range starts past the end of the content.
    """
    match = _RANGE.match((header or "").strip())
    if match is None or match.groups() == ("", ""):
        return None
    first, last = match.groups()
    if first == "":  # the last N bytes
        start, end = max(0, size - int(last)), size - 1
    else:
        start = int(first)
        end = min(int(last), size - 1) if last else size - 1
        if last and int(last) < start:
            return None
    if start >= size or size == 0:
        raise RangeNotSatisfiableError(
            f"the range {header!r} starts past the end of the {size}-byte content",
            size=str(size),
        )
    return start, end


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover - makes this an async generator


def version_json(version: Version) -> dict[str, Any]:
    """Render one version for the API."""
    return {
        "version": version.version,
        "runId": version.run_id,
        "toolCallId": version.tool_call_id,
        "mediaType": version.media_type,
        "size": version.size,
        "checksum": version.checksum,
        "metadata": version.metadata,
        "createdAt": iso(version.created_at),
        "link": content_link(version.artifact_id, version.version),
    }


def artifact_json(artifact: Artifact, *, versions: bool = False) -> dict[str, Any]:
    """Render an artifact for the API: its record, its latest version, and its history."""
    latest = artifact.latest
    out: dict[str, Any] = {
        "id": artifact.id,
        "tenantId": artifact.tenant_id,
        "conversationId": artifact.conversation_id,
        "runId": artifact.run_id,
        "name": artifact.name,
        "version": artifact.latest_version,
        "status": latest.status if latest else "writing",
        "mediaType": latest.media_type if latest else None,
        "size": latest.size if latest else None,
        "checksum": latest.checksum if latest else None,
        "metadata": latest.metadata if latest else {},
        "objectKey": latest.object_key if latest else None,
        "createdAt": iso(artifact.created_at),
        "updatedAt": iso(artifact.updated_at),
        "link": content_link(artifact.id, artifact.latest_version),
    }
    if versions:
        out["versions"] = [version_json(v) for v in artifact.versions]
    return out


class ArtifactService:
    """Artifacts as the caller's tenant may see them."""

    def __init__(self, pool: Pool, storage: Storage, *, url_ttl_s: int) -> None:
        self.pool = pool
        self.storage = storage
        self.url_ttl_s = url_ttl_s

    async def list_for_run(self, who: Principal, run_id: str) -> list[Artifact]:
        """Return the artifacts the run and its descendants (subagents) wrote, oldest first.

        Raises:
            RunNotFoundError: no such run in the caller's tenant.
        """
        async with self.pool.connection() as conn:
            run = await get_run(conn, who, run_id)
            runs = await runs_in_listing(conn, run)
            ids = await artifact_ids_of_runs(conn, who.tenant_id, runs)
            return await load_artifacts(conn, who.tenant_id, ids)

    async def get(self, who: Principal, artifact_id: str) -> Artifact:
        """Return one artifact with its versions.

        Raises:
            ArtifactNotFoundError: no such artifact in the caller's tenant.
        """
        async with self.pool.connection() as conn:
            found = await load_artifacts(conn, who.tenant_id, [artifact_id])
        if not found:
            raise ArtifactNotFoundError(f"no artifact {artifact_id}")
        return found[0]

    async def version(self, who: Principal, artifact_id: str, number: int | None) -> Version:
        """Return a version of an artifact (the latest when `number` is None).

        Raises:
            ArtifactNotFoundError: no such artifact, or no such version of it.
        """
        artifact = await self.get(who, artifact_id)
        for version in artifact.versions:
            if version.version == (number or artifact.latest_version):
                return version
        raise ArtifactNotFoundError(
            f"artifact {artifact_id} has no version {number}; its versions are "
            + ", ".join(str(v.version) for v in artifact.versions)
        )

    async def content(
        self, who: Principal, artifact_id: str, number: int | None, range_header: str | None
    ) -> Download:
        """Return a version's content as a stream, or the byte range the header asks for.

        Raises:
            ArtifactNotFoundError: no such artifact or version.
            RangeNotSatisfiableError: the range starts past the end of the content.
        """
        version = await self.version(who, artifact_id, number)
        size = version.size or 0
        span = byte_range(range_header, size)
        start, end = span or (0, size - 1)
        headers = {
            "Accept-Ranges": "bytes",
            "Content-Length": str(end - start + 1),
            "Content-Disposition": content_disposition(version.name),
            "ETag": f'"{version.checksum}"',
            "X-Artifact-Version": str(version.version),
        }
        if span is not None:
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        body = self.storage.read(version.object_key, start, end) if size else _nothing()
        return Download(version, start, end, body, span is not None, headers)

    async def signed_url(
        self, who: Principal, artifact_id: str, number: int | None
    ) -> dict[str, Any]:
        """Return a short-lived direct URL (object storage), else the API's content link.

        Raises:
            ArtifactNotFoundError: no such artifact or version.
        """
        version = await self.version(who, artifact_id, number)
        url = self.storage.signed_url(
            version.object_key, version.media_type, version.name, self.url_ttl_s
        )
        if url is None:
            return {
                "url": content_link(artifact_id, version.version),
                "direct": False,
                "expiresAt": None,
            }
        expires = datetime.now(UTC) + timedelta(seconds=self.url_ttl_s)
        return {"url": url, "direct": True, "expiresAt": iso(expires)}
