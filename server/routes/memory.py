"""Long-term memories: list and search, read, add, change, delete (docs/memory.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Path, Query, Response, status
from pydantic import Field

from server.deps import MemoryDep
from server.routes.guards import CleanText
from server.routes.schemas import BODY_ERRORS, COMMON_ERRORS, ApiModel, errors
from tools.jsontypes import JsonFloat
from tools.memory.book import MAX_TEXT

router = APIRouter(prefix="/api/memories", tags=["memory"], responses=COMMON_ERRORS)
KindName = Literal["fact", "preference", "instruction", "episode"]
ID_PATTERN = r"^[A-Za-z0-9_.:@-]{1,200}$"
UserParam = Annotated[
    str | None,
    Query(
        alias="userId",
        pattern=ID_PATTERN,
        description="Whose memories (admins); yours if unset.",
    ),
]
MemoryId = Annotated[str, Path(pattern=r"^mem_[A-Za-z0-9]{1,64}$", description="`mem_...`")]


class MemoryIn(ApiModel):
    """Body of `POST /api/memories`."""

    text: str = Field(min_length=1, max_length=MAX_TEXT)
    kind: KindName = "fact"
    scope: Literal["user", "tenant"] = "user"
    user_id: str | None = Field(default=None, pattern=ID_PATTERN)
    confidence: JsonFloat = Field(default=1.0, ge=0.0, le=1.0)
    expires_in_days: JsonFloat | None = Field(default=None, gt=0, le=36_500)


class MemoryPatch(ApiModel):
    """Body of `PATCH /api/memories/{id}`: the fields to change."""

    text: str | None = Field(default=None, min_length=1, max_length=MAX_TEXT)
    kind: KindName | None = None
    confidence: JsonFloat | None = Field(default=None, ge=0.0, le=1.0)
    expires_in_days: JsonFloat | None = Field(default=None, gt=0, le=36_500)


class MemoryOut(ApiModel):
    """One memory."""

    id: str
    tenant_id: str
    user_id: str | None
    scope: str
    text: str
    kind: str
    confidence: float
    source_run_id: str | None
    source_message_id: str | None
    created_by: str | None
    created_at: str | None
    updated_at: str | None
    expires_at: str | None
    similarity: float | None = None


class MemoryList(ApiModel):
    """Memories, newest first, or most similar first when searching."""

    memories: list[MemoryOut]


class Forgotten(ApiModel):
    """What `DELETE /api/memories?userId=` removed."""

    deleted: int


@router.get("", response_model=MemoryList)
async def list_memories(
    memory: MemoryDep,
    q: Annotated[str | None, Query(max_length=2_000, description="Search text.")] = None,
    kind: Annotated[KindName | None, Query()] = None,
    user_id: UserParam = None,
    scope: Annotated[Literal["user", "tenant"] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=10_000)] = 0,
) -> dict[str, Any]:
    """List or search memories: yours and the tenant's shared ones (an admin: anyone's)."""
    found = await memory.search(
        query=q, user_id=user_id, scope=scope, kind=kind, limit=limit, offset=offset
    )
    return {"memories": [m.to_json() for m in found]}


@router.get("/{memory_id}", response_model=MemoryOut, responses=errors(403, 404))
async def get_memory(
    memory: MemoryDep,
    memory_id: MemoryId,
    user_id: UserParam = None,
) -> dict[str, Any]:
    """Read one memory."""
    return (await memory.get(memory_id, user_id)).to_json()


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=MemoryOut,
    responses={**BODY_ERRORS, **errors(403)},
)
async def post_memory(
    memory: MemoryDep,
    body: Annotated[MemoryIn, CleanText, Body()],
) -> dict[str, Any]:
    """Remember something (for yourself; for another user or the whole tenant: admins)."""
    data = body.model_dump(by_alias=True)
    return (await memory.create(data)).to_json()


@router.patch(
    "/{memory_id}", response_model=MemoryOut, responses={**BODY_ERRORS, **errors(403, 404)}
)
async def patch_memory(
    memory: MemoryDep,
    memory_id: MemoryId,
    body: Annotated[MemoryPatch, CleanText, Body()],
    user_id: UserParam = None,
) -> dict[str, Any]:
    """Change a memory's text, kind, confidence or expiry."""
    data = body.model_dump(by_alias=True, exclude_unset=True)
    return (await memory.update(memory_id, data, user_id)).to_json()


@router.delete("/{memory_id}", status_code=status.HTTP_204_NO_CONTENT, responses=errors(403, 404))
async def delete_memory(
    memory: MemoryDep,
    memory_id: MemoryId,
    user_id: UserParam = None,
) -> Response:
    """Forget one memory."""
    await memory.delete(memory_id, user_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.delete("", response_model=Forgotten, responses=errors(403))
async def forget_user(memory: MemoryDep, user_id: UserParam = None) -> dict[str, Any]:
    """Forget everything remembered about a user (yourself by default)."""
    return {"deleted": await memory.forget_user(user_id)}
