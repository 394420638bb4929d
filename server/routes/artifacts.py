"""Artifacts: a run's list, one artifact with its versions, its content, a direct URL."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query
from fastapi.responses import StreamingResponse

from server.artifacts.service import artifact_json
from server.deps import ArtifactsDep, PrincipalDep
from server.routes.schemas import COMMON_ERRORS, ApiModel, ErrorBody, errors

router = APIRouter(tags=["artifacts"], responses=COMMON_ERRORS)
ArtifactId = Annotated[str, Path(pattern=r"^art_[A-Za-z0-9]{1,64}$", description="`art_...`")]
VersionParam = Annotated[
    int | None, Query(ge=1, le=1_000_000, description="A version number; the latest if unset.")
]
NOT_SATISFIABLE: dict[int | str, dict[str, Any]] = {
    416: {"model": ErrorBody, "description": "The range is past the content."}
}


class ArtifactVersion(ApiModel):
    """One version of an artifact."""

    version: int
    run_id: str
    tool_call_id: str
    media_type: str
    size: int | None
    checksum: str | None
    metadata: dict[str, Any]
    created_at: str | None
    link: str


class Artifact(ApiModel):
    """An artifact and its latest version (`versions`: its history, oldest first)."""

    id: str
    tenant_id: str
    conversation_id: str
    run_id: str
    name: str
    version: int
    status: str
    media_type: str | None
    size: int | None
    checksum: str | None
    metadata: dict[str, Any]
    object_key: str | None
    created_at: str | None
    updated_at: str | None
    link: str
    versions: list[ArtifactVersion] | None = None


class ArtifactList(ApiModel):
    """The artifacts a run wrote, oldest first."""

    artifacts: list[Artifact]


class ArtifactUrl(ApiModel):
    """Where to download a version: a signed object-storage URL, or the API's own link."""

    url: str
    direct: bool
    expires_at: str | None


@router.get("/api/runs/{run_id}/artifacts", response_model=ArtifactList, responses=errors(404))
async def list_run_artifacts(
    run_id: str, who: PrincipalDep, artifacts: ArtifactsDep
) -> dict[str, Any]:
    """List the artifacts the run wrote (each with its latest version)."""
    found = await artifacts.list_for_run(who, run_id)
    return {"artifacts": [artifact_json(a) for a in found]}


@router.get("/api/artifacts/{artifact_id}", response_model=Artifact, responses=errors(404))
async def get_artifact(
    artifact_id: ArtifactId, who: PrincipalDep, artifacts: ArtifactsDep
) -> dict[str, Any]:
    """Return an artifact's record and its versions."""
    return artifact_json(await artifacts.get(who, artifact_id), versions=True)


@router.get(
    "/api/artifacts/{artifact_id}/content",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}},
            "description": "The content, with the media type it was stored with.",
        },
        206: {"description": "The byte range asked for."},
        **errors(404),
        **NOT_SATISFIABLE,
    },
)
async def get_artifact_content(
    artifact_id: ArtifactId,
    who: PrincipalDep,
    artifacts: ArtifactsDep,
    version: VersionParam = None,
    range_header: Annotated[str | None, Header(alias="Range")] = None,
) -> StreamingResponse:
    """Stream a version's content with its media type; a `Range: bytes=` header gets 206."""
    download = await artifacts.content(who, artifact_id, version, range_header)
    return StreamingResponse(
        download.body,
        status_code=download.status,
        media_type=download.version.media_type,
        headers=download.headers,
    )


@router.get("/api/artifacts/{artifact_id}/url", response_model=ArtifactUrl, responses=errors(404))
async def get_artifact_url(
    artifact_id: ArtifactId,
    who: PrincipalDep,
    artifacts: ArtifactsDep,
    version: VersionParam = None,
) -> dict[str, Any]:
    """Return a short-lived signed URL to the content (object storage), else the API's link."""
    return await artifacts.signed_url(who, artifact_id, version)
