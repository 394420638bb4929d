"""Artifacts for tools: files a tool produces, kept beside the run instead of in its text.

A tool hands content to `save_artifact` and gets an `ArtifactRef` back (id, version, size,
checksum, link), which it may return as its result: the model then reads the reference, not
the content. The server stores the bytes and the record through the run's `ArtifactSink`
(passed in `RunContext.artifacts`), so this package never imports the server. The write is
keyed by the tool call's idempotency key: a call run again after a crash finds the version it
already wrote instead of adding another.
"""

from __future__ import annotations

import asyncio
import mimetypes
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from langchain_core.tools import ToolException
from langgraph.config import get_stream_writer
from langgraph.runtime import get_runtime
from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from graphs.events import ArtifactWritten, EventType
from tools.spec import ToolCallContext

CHUNK_BYTES = 1 << 20
MAX_NAME = 255
DEFAULT_MEDIA_TYPE = "application/octet-stream"
Content = bytes | str | Path | AsyncIterable[bytes] | Iterable[bytes]


class ArtifactRef(BaseModel):
    """A stored artifact version, as a tool returns it and the model reads it.

    Attributes:
        id: The artifact's id (`art_...`), shared by all its versions.
        name: Its name, unique within the conversation.
        version: This version's number, from 1.
        media_type: Its content type.
        size: Bytes.
        checksum: `sha256:<hex>` of the content.
        link: Where a client downloads this version (an API path).
        created: True for the first version of the artifact, False for a new version.
        replayed: True when this call had already written it (a call run again).
    """

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True, frozen=True
    )

    id: str
    name: str
    version: int
    media_type: str
    size: int
    checksum: str
    link: str
    created: bool = True
    replayed: bool = False


@dataclass(frozen=True)
class ArtifactWrite:
    """What a tool asks to store; the sink adds the run's tenant, user and conversation.

    Attributes:
        tool_call_id: The call writing it (its `message`).
        idempotency_key: The call's key: one version per key, however often the call runs.
        name: The artifact's name; writing a name again makes a new version.
        media_type: Its content type.
        metadata: Free JSON the API returns with it.
    """

    tool_call_id: str
    idempotency_key: str
    name: str
    media_type: str
    metadata: dict[str, Any] = field(default_factory=dict)


class ArtifactSink(Protocol):
    """Where a run's artifacts go: the server's storage and records (server/artifacts/)."""

    @property
    def file_root(self) -> Path | None:
        """The folder `write_artifact(from_file=...)` may read from; None refuses files."""
        ...

    async def write(self, request: ArtifactWrite, content: AsyncIterator[bytes]) -> ArtifactRef:
        """Store `content` as a version of the artifact named in `request`; return it."""
        ...


def check_name(name: str) -> str:
    """Return `name` if it can name an artifact, else raise ValueError saying why."""
    if not name or name != name.strip():
        raise ValueError("an artifact name must be non-empty, without spaces around it")
    if len(name) > MAX_NAME:
        raise ValueError(f"an artifact name is at most {MAX_NAME} characters, not {len(name)}")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ValueError("an artifact name may not contain control characters")
    return name


def guess_media_type(name: str, content: Content | None = None) -> str:
    """Return the media type for `name` (by extension), text/plain for text of unknown type."""
    guessed, _ = mimetypes.guess_type(name, strict=False)
    if guessed:
        return guessed
    return "text/plain" if isinstance(content, str) else DEFAULT_MEDIA_TYPE


async def _read_file(path: Path) -> AsyncIterator[bytes]:
    with path.open("rb") as handle:
        while chunk := await asyncio.to_thread(handle.read, CHUNK_BYTES):
            yield chunk


async def chunks_of(content: Content) -> AsyncIterator[bytes]:
    """Yield `content` as byte chunks without reading a file or a stream whole."""
    if isinstance(content, str):
        content = content.encode("utf-8")
    if isinstance(content, bytes):
        for start in range(0, len(content), CHUNK_BYTES):
            yield content[start : start + CHUNK_BYTES]
    elif isinstance(content, Path):
        async for chunk in _read_file(content):
            yield chunk
    elif isinstance(content, AsyncIterable):
        async for chunk in content:
            yield bytes(chunk)
    else:
        for chunk in content:
            yield bytes(chunk)


def run_sink() -> ArtifactSink:
    """Return the running graph's artifact sink, or refuse plainly."""
    try:
        context = getattr(get_runtime(), "context", None)
    except RuntimeError as exc:
        raise ToolException("artifacts can be written only inside an agent run") from exc
    sink = getattr(context, "artifacts", None)
    if sink is None:
        raise ToolException("this agent has no artifact storage configured")
    return sink  # type: ignore[no-any-return]


def artifact_event(ref: ArtifactRef, tool_call_id: str) -> ArtifactWritten:
    """Return the `artifact.created` (first version) or `artifact.updated` event of `ref`."""
    return {
        "event": EventType.ARTIFACT_CREATED if ref.version == 1 else EventType.ARTIFACT_UPDATED,
        "artifactId": ref.id,
        "name": ref.name,
        "version": ref.version,
        "mediaType": ref.media_type,
        "size": ref.size,
        "checksum": ref.checksum,
        "link": ref.link,
        "toolCallId": tool_call_id,
        "replayed": ref.replayed,
    }


async def save_artifact(
    call: ToolCallContext,
    name: str,
    content: Content,
    *,
    media_type: str | None = None,
    metadata: dict[str, Any] | None = None,
    sink: ArtifactSink | None = None,
) -> ArtifactRef:
    """Store `content` as an artifact of the run making `call`; emit its event; return it.

    Large content should come as a `Path` or an (async) iterable of chunks: it is streamed to
    storage, never held whole. Writing a name the conversation already has adds a version.

    Args:
        call: The tool call's context (the tool's `CallContext` parameter).
        name: The artifact's name, e.g. `report.md`.
        content: Text, bytes, a file path, or chunks.
        media_type: Its content type; guessed from the name when omitted.
        metadata: Free JSON kept with the version.
        sink: Where to store it; the running graph's when omitted.

    Raises:
        ValueError: the name is not usable.
    """
    check_name(name)
    target = sink or run_sink()
    request = ArtifactWrite(
        tool_call_id=call.tool_call_id,
        idempotency_key=call.idempotency_key,
        name=name,
        media_type=media_type or guess_media_type(name, content),
        metadata=dict(metadata or {}),
    )
    ref = await target.write(request, chunks_of(content))
    try:
        writer = get_stream_writer()
    except RuntimeError:
        writer = None  # called outside a graph (a script, a test): nothing to stream to
    if writer is not None:
        writer(artifact_event(ref, call.tool_call_id))
    return ref
