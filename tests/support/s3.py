"""A real S3-compatible server for tests: moto's server mode, in a process of its own."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
from pydantic import SecretStr

from server.settings import Settings
from tests.support.live import free_port

ACCESS_KEY = "test-access-key"
SECRET_KEY = "test-secret-key"
REGION = "us-east-1"


@contextlib.asynccontextmanager
async def s3_server(limit_s: float = 120) -> AsyncIterator[str]:
    """Start `moto.server` on a free loopback port; yield its endpoint URL once it answers."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "moto.server",
        "-H",
        "127.0.0.1",
        "-p",
        str(port),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        async with asyncio.timeout(limit_s), httpx.AsyncClient() as client:
            while True:
                if proc.returncode is not None:
                    raise RuntimeError(f"moto.server exited with {proc.returncode}")
                with contextlib.suppress(httpx.HTTPError):
                    await client.get(f"{endpoint}/moto-api/")
                    break
                await asyncio.sleep(0.1)
        yield endpoint
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                async with asyncio.timeout(20):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()


def s3_settings(settings: Settings, endpoint: str, bucket: str) -> Settings:
    """Return `settings` storing artifacts in `bucket` at `endpoint`, with small parts."""
    return settings.model_copy(
        update={
            "artifact_storage": "s3",
            "artifact_s3_bucket": bucket,
            "artifact_s3_endpoint_url": endpoint,
            "artifact_s3_region": REGION,
            "artifact_s3_access_key_id": ACCESS_KEY,
            "artifact_s3_secret_access_key": SecretStr(SECRET_KEY),
            "artifact_s3_addressing_style": "path",
            "artifact_part_bytes": 5 * 1024 * 1024,
        }
    )


def make_bucket(endpoint: str, bucket: str) -> Any:
    """Create `bucket` and return a boto3 client of the server (for the test's own checks)."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
    )
    client.create_bucket(Bucket=bucket)
    return client
