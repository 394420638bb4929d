"""Artifacts: a large file written by a tool and downloaded again, on both storage backends.

For each backend (the local folder; S3 through moto's server mode on loopback, standing in
for an S3-compatible service), an `agentrt serve` process with in-process workers runs a
scripted `write_artifact(from_file=...)` of a 200 MB file (50 MB with --quick), then the file
is downloaded over HTTP. Figures: the run's wall time, the download's throughput, and how much
the server's peak RSS rose over both (Linux `clear_refs` resets the peak before).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    Figures,
    env_for,
    follow_to_end,
    free_port,
    http,
    post_run,
    processes,
    run_async,
    start_api,
    write_scripts,
)
from nodes.models.scripted import ScriptedToolCall, ScriptedTurn

MIB = 1 << 20
SCRIPT = [
    ScriptedTurn(
        tool_calls=[
            ScriptedToolCall(
                id="c_big", name="write_artifact", args={"name": "big.bin", "from_file": "big.bin"}
            )
        ]
    ).model_dump(),
    ScriptedTurn(text="Saved.").model_dump(),
]


def _make_file(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with path.open("wb") as handle:
        for _ in range(size // MIB):
            block = os.urandom(MIB)
            digest.update(block)
            handle.write(block)
    return digest.hexdigest()


@contextlib.contextmanager
def s3_endpoint() -> Iterator[str]:
    """Start moto's S3 server on loopback with a bucket `bench`; yield its endpoint."""
    import boto3

    port = free_port()
    popen = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"{endpoint}/moto-api/", timeout=1)
                break
            if time.monotonic() > deadline:
                raise TimeoutError("moto.server did not start")
            time.sleep(0.1)
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        ).create_bucket(Bucket="bench")
        yield endpoint
    finally:
        popen.terminate()
        popen.wait(30)


def _status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak RSS becomes the current RSS


async def _measure(url: str, pid: int, size: int, expected: str) -> dict[str, float]:
    async with http(url) as client:
        await client.get("/api/runs")
        before = _status(pid)["VmRSS"]
        _reset_peak(pid)
        began = time.monotonic()
        run_id = await post_run(client, "scripted:big")
        assert await follow_to_end(client, run_id) == "run.completed"
        written = time.monotonic() - began
        listed = (await client.get(f"/api/runs/{run_id}/artifacts")).json()["artifacts"]
        digest, received, began = hashlib.sha256(), 0, time.monotonic()
        async with client.stream("GET", listed[0]["link"]) as response:
            async for chunk in response.aiter_bytes():
                digest.update(chunk)
                received += len(chunk)
        read = time.monotonic() - began
        assert received == size and digest.hexdigest() == expected, "content differs"
        peak = _status(pid)["VmHWM"]
    return {"write_s": written, "read_s": read, "growth_mib": (peak - before) / MIB}


def main(database_url: str, quick: bool) -> Figures:
    """Run the benchmark; return its figures."""
    size = (50 if quick else 200) * MIB
    figures = Figures("Artifacts", "python -m bench.run --only artifacts")
    figures.add(
        f"A {size // MIB} MB file written by `write_artifact(from_file=...)` in a run, "
        "then downloaded over HTTP, through one `agentrt serve` process:"
    )
    figures.add("")
    with tempfile.TemporaryDirectory(prefix="agentrt-bench-artifacts-") as tmp:
        folder = Path(tmp)
        (folder / "workspace").mkdir()
        expected = _make_file(folder / "workspace" / "big.bin", size)
        scripts = write_scripts(folder, {"big": SCRIPT})
        base: dict[str, Any] = {
            "scripted_models_file": str(scripts),
            "artifact_file_root": str(folder / "workspace"),
        }
        with s3_endpoint() as endpoint:
            backends = {
                "local": {**base, "artifact_dir": str(folder / "store")},
                "s3 (moto)": {
                    **base,
                    "artifact_storage": "s3",
                    "artifact_s3_bucket": "bench",
                    "artifact_s3_endpoint_url": endpoint,
                    "artifact_s3_region": "us-east-1",
                    "artifact_s3_access_key_id": "bench",
                    "artifact_s3_secret_access_key": "bench",
                    "artifact_s3_addressing_style": "path",
                },
            }
            for name, settings in backends.items():
                env = env_for(database_url, **settings)
                with processes([start_api(env, workers=True, limit_s=120)]) as (api,):
                    assert api.url is not None
                    got = run_async(_measure(api.url, api.popen.pid, size, expected))
                mb = size / 1e6
                figures.add(
                    f"- {name}: run with the write {got['write_s']:.1f} s "
                    f"({mb / got['write_s']:.0f} MB/s), download {got['read_s']:.1f} s "
                    f"({mb / got['read_s']:.0f} MB/s), server peak RSS "
                    f"+{got['growth_mib']:.1f} MiB"
                )
    return figures
