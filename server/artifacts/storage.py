"""Where artifact bytes live: one small interface, the local folder or S3-compatible storage.

Content is streamed both ways, one chunk (or one multipart part) at a time, so an artifact of
any size passes through a fixed amount of memory. Objects are written under a key the records
choose; a write that did not finish leaves no visible object (a temporary file renamed into
place; an S3 multipart upload that is aborted).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from server.settings import Settings

READ_CHUNK = 1 << 20


class Storage(ABC):
    """An object store for artifact content."""

    #: Whether `signed_url` can hand out direct links to the content.
    signs_urls: bool = False

    @abstractmethod
    async def put(self, key: str, chunks: AsyncIterator[bytes], media_type: str) -> None:
        """Store the chunks as object `key`, replacing any object of that key."""

    @abstractmethod
    def read(self, key: str, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        """Yield bytes `start`..`end` (inclusive; None: to the end) of object `key`."""

    @abstractmethod
    async def delete(self, key: str) -> None:
        """Delete object `key`; a missing object is not an error."""

    def signed_url(self, key: str, media_type: str, filename: str, expires_s: int) -> str | None:
        """Return a short-lived URL that downloads `key` directly, if the store has them."""
        return None


class LocalStorage(Storage):
    """Objects as files under one folder (the data folder's `artifacts/` by default)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path_of(self, key: str) -> Path:
        """Return the file of object `key`, refusing keys that would leave the folder."""
        path = (self.root / key).resolve()
        if not path.is_relative_to(self.root.resolve()):
            raise ValueError(f"object key {key!r} leaves the storage folder")
        return path

    async def put(self, key: str, chunks: AsyncIterator[bytes], media_type: str) -> None:
        """Write the chunks to a temporary file beside the object, then rename it into place."""
        path = self.path_of(key)
        await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".partial-")
        try:
            with os.fdopen(fd, "wb") as handle:
                async for chunk in chunks:
                    await asyncio.to_thread(handle.write, chunk)
                await asyncio.to_thread(os.fsync, handle.fileno())
            await asyncio.to_thread(os.replace, temp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise

    async def read(self, key: str, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        """Yield the file's bytes from `start` to `end`, a chunk at a time."""
        handle = await asyncio.to_thread(self.path_of(key).open, "rb")
        try:
            await asyncio.to_thread(handle.seek, start)
            left = None if end is None else end - start + 1
            while left is None or left > 0:
                size = READ_CHUNK if left is None else min(READ_CHUNK, left)
                chunk = await asyncio.to_thread(handle.read, size)
                if not chunk:
                    break
                if left is not None:
                    left -= len(chunk)
                yield chunk
        finally:
            await asyncio.to_thread(handle.close)

    async def delete(self, key: str) -> None:
        """Delete the object's file."""
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(self.path_of(key).unlink)


class S3Storage(Storage):
    """Objects in an S3-compatible bucket (AWS S3, MinIO, R2, GCS's S3 API) through boto3.

    boto3 is synchronous; each request runs in a thread. Uploads larger than one part use a
    multipart upload, so no more than one part is held in memory.
    """

    signs_urls = True

    def __init__(self, client: Any, bucket: str, *, prefix: str = "", part_bytes: int) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix
        self.part_bytes = part_bytes

    def _key(self, key: str) -> str:
        return f"{self.prefix}{key}"

    async def put(self, key: str, chunks: AsyncIterator[bytes], media_type: str) -> None:
        """Upload the chunks: one request when small, else a multipart upload."""
        first = await _fill(chunks, self.part_bytes)
        if len(first) < self.part_bytes:
            await asyncio.to_thread(
                self.client.put_object,
                Bucket=self.bucket,
                Key=self._key(key),
                Body=bytes(first),
                ContentType=media_type,
            )
            return
        upload = await asyncio.to_thread(
            self.client.create_multipart_upload,
            Bucket=self.bucket,
            Key=self._key(key),
            ContentType=media_type,
        )
        upload_id = upload["UploadId"]
        parts: list[dict[str, Any]] = []
        try:
            part = first
            while part:
                number = len(parts) + 1
                answer = await asyncio.to_thread(
                    self.client.upload_part,
                    Bucket=self.bucket,
                    Key=self._key(key),
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=bytes(part),
                )
                parts.append({"PartNumber": number, "ETag": answer["ETag"]})
                part = await _fill(chunks, self.part_bytes)
            await asyncio.to_thread(
                self.client.complete_multipart_upload,
                Bucket=self.bucket,
                Key=self._key(key),
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
            )
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(
                    self.client.abort_multipart_upload,
                    Bucket=self.bucket,
                    Key=self._key(key),
                    UploadId=upload_id,
                )
            raise

    async def read(self, key: str, start: int = 0, end: int | None = None) -> AsyncIterator[bytes]:
        """Stream the object (a ranged GET) a chunk at a time."""
        span = f"bytes={start}-{'' if end is None else end}"
        answer = await asyncio.to_thread(
            self.client.get_object, Bucket=self.bucket, Key=self._key(key), Range=span
        )
        body = answer["Body"]
        try:
            while chunk := await asyncio.to_thread(body.read, READ_CHUNK):
                yield chunk
        finally:
            body.close()

    async def delete(self, key: str) -> None:
        """Delete the object (S3 answers a missing key with success)."""
        await asyncio.to_thread(self.client.delete_object, Bucket=self.bucket, Key=self._key(key))

    def signed_url(self, key: str, media_type: str, filename: str, expires_s: int) -> str | None:
        """Return a presigned GET URL that answers with the artifact's type and file name."""
        url: str = self.client.generate_presigned_url(
            "get_object",
            Params={
                "Bucket": self.bucket,
                "Key": self._key(key),
                "ResponseContentType": media_type,
                "ResponseContentDisposition": content_disposition(filename),
            },
            ExpiresIn=expires_s,
        )
        return url


async def _fill(chunks: AsyncIterator[bytes], size: int) -> bytearray:
    """Read chunks until `size` bytes are buffered or the stream ends; return the buffer.

    Whatever a chunk holds past `size` is kept in the buffer: parts may run one chunk over.
    """
    buffer = bytearray()
    while len(buffer) < size:
        try:
            buffer += await anext(chunks)
        except StopAsyncIteration:
            break
    return buffer


def content_disposition(filename: str) -> str:
    """Return an `attachment` Content-Disposition that survives any file name (RFC 6266)."""
    from urllib.parse import quote

    ascii_name = filename.encode("ascii", "replace").decode().replace('"', "'").replace("\\", "_")
    return f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(filename)}"


def make_storage(settings: Settings) -> Storage:
    """Build the storage the settings name: `local` (default) or `s3`."""
    if settings.artifact_storage == "local":
        return LocalStorage(settings.artifact_dir or settings.data_dir / "artifacts")
    import boto3
    from botocore.config import Config

    secret = settings.artifact_s3_secret_access_key
    client = boto3.client(
        "s3",
        endpoint_url=settings.artifact_s3_endpoint_url,
        region_name=settings.artifact_s3_region,
        aws_access_key_id=settings.artifact_s3_access_key_id,
        aws_secret_access_key=secret.get_secret_value() if secret else None,
        config=Config(
            signature_version="s3v4",
            s3={"addressing_style": settings.artifact_s3_addressing_style},
            retries={"mode": "standard", "max_attempts": 5},
        ),
    )
    assert settings.artifact_s3_bucket is not None  # the settings refuse s3 without a bucket
    return S3Storage(
        client,
        settings.artifact_s3_bucket,
        prefix=settings.artifact_s3_prefix,
        part_bytes=settings.artifact_part_bytes,
    )
