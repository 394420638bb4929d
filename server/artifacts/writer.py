"""The server's side of `tools.artifacts.ArtifactSink`: a run's artifacts into storage."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

from server.artifacts.records import Owner, Version, begin_version, finish_version
from server.artifacts.storage import Storage
from server.db.pool import Pool
from server.domain import Run
from server.errors import ArtifactTooLargeError
from tools.artifacts.api import ArtifactRef, ArtifactWrite


def content_link(artifact_id: str, version: int) -> str:
    """Return the API path that downloads one version."""
    return f"/api/artifacts/{artifact_id}/content?version={version}"


def ref_of(version: Version, *, replayed: bool = False) -> ArtifactRef:
    """Return the reference a tool (and the model) gets for a stored version."""
    return ArtifactRef(
        id=version.artifact_id,
        name=version.name,
        version=version.version,
        media_type=version.media_type,
        size=version.size or 0,
        checksum=version.checksum or "",
        link=content_link(version.artifact_id, version.version),
        created=version.version == 1,
        replayed=replayed,
    )


class RunArtifacts:
    """One run's artifact sink: records in Postgres, bytes in the process's storage.

    Tenant, user and conversation come from the run, never from the tool.
    """

    def __init__(
        self,
        pool: Pool,
        storage: Storage,
        run: Run,
        *,
        max_bytes: int,
        file_root: Path | None = None,
    ) -> None:
        self._pool = pool
        self._storage = storage
        self._owner = Owner(run.tenant_id, run.user_id, run.conversation_id, run.id)
        self._max_bytes = max_bytes
        self._file_root = file_root

    @property
    def file_root(self) -> Path | None:
        """The folder `write_artifact(from_file=...)` may read from; None refuses files."""
        return self._file_root

    async def write(self, request: ArtifactWrite, content: AsyncIterator[bytes]) -> ArtifactRef:
        """Store `content` as the call's version of the named artifact; return it.

        A call that already stored its version gets that version back and its content is
        not read; one that began but did not finish (a crash) stores it again under the same
        key and version.

        Raises:
            ArtifactTooLargeError: the content is over `artifact_max_bytes`.
        """
        version = await begin_version(
            self._pool,
            self._owner,
            name=request.name,
            tool_call_id=request.tool_call_id,
            idempotency_key=request.idempotency_key,
            media_type=request.media_type,
            metadata=request.metadata,
        )
        if version.status == "ready":
            return ref_of(version, replayed=True)
        digest = hashlib.sha256()
        size = 0

        async def measured() -> AsyncIterator[bytes]:
            nonlocal size
            async for chunk in content:
                size += len(chunk)
                if size > self._max_bytes:
                    raise ArtifactTooLargeError(
                        f"artifact {request.name!r} is over the {self._max_bytes}-byte limit "
                        "(AGENTRT_ARTIFACT_MAX_BYTES)"
                    )
                digest.update(chunk)
                yield chunk

        await self._storage.put(version.object_key, measured(), version.media_type)
        stored = await finish_version(
            self._pool, version, size=size, checksum=f"sha256:{digest.hexdigest()}"
        )
        return ref_of(stored)
