"""`agentrt artifacts list|get`: a run's artifacts, one artifact's versions, its content."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Any, BinaryIO

from server.client.errors import ClientError
from server.client.follow import ClientConfig, check, open_client


def print_artifacts(artifacts: list[dict[str, Any]]) -> None:
    """Print artifacts as a table with a header."""
    print(f"{'ID':<38} {'VER':>4} {'SIZE':>12} {'TYPE':<28} NAME")
    for a in artifacts:
        print(
            f"{a['id']:<38} {a['version']:>4} {a.get('size') or 0:>12} "
            f"{a.get('mediaType') or '-':<28} {a['name']}"
        )


async def _download(client: Any, artifact_id: str, version: int | None, out: str) -> int:
    """Stream one version's content to `out` (`-`: standard output); return the bytes."""
    params = {"version": version} if version else {}
    async with client.stream("GET", f"/api/artifacts/{artifact_id}/content", params=params) as r:
        if r.status_code >= 400:
            await r.aread()
            check(r)
        written = 0
        with contextlib.ExitStack() as stack:
            sink: BinaryIO = sys.stdout.buffer
            if out != "-":
                sink = stack.enter_context(await asyncio.to_thread(Path(out).open, "wb"))
            async for chunk in r.aiter_bytes():
                sink.write(chunk)
                written += len(chunk)
            sink.flush()
    return written


async def cmd_artifacts(settings: ClientConfig, args: argparse.Namespace) -> int:
    """`agentrt artifacts list RUN | get ARTIFACT [--version N] [-o FILE | --json]`."""
    async with open_client(settings.url, settings.api_key) as client:
        if args.action == "list":
            found = check(await client.get(f"/api/runs/{args.run_id}/artifacts"))["artifacts"]
            if args.json:
                print(json.dumps(found, indent=2))
            else:
                print_artifacts(found)
            return 0
        if args.output:
            written = await _download(client, args.artifact_id, args.version, args.output)
            if args.output != "-":
                print(f"wrote {written} bytes to {args.output}")
            return 0
        record = check(await client.get(f"/api/artifacts/{args.artifact_id}"))
        if args.json:
            print(json.dumps(record, indent=2))
            return 0
        print(f"{record['id']}  {record['name']}  (run {record['runId']})")
        for v in record.get("versions") or []:
            print(
                f"  v{v['version']:<4} {v.get('size') or 0:>12} bytes  {v['mediaType']:<28} "
                f"{v['createdAt']}  {v['checksum']}"
            )
        if args.version and not any(v["version"] == args.version for v in record["versions"]):
            raise ClientError(f"{args.artifact_id} has no version {args.version}")
    return 0


def add_artifacts_parser(sub: Any, client: argparse.ArgumentParser) -> None:
    """Add `agentrt artifacts ...` to the command line."""
    artifacts = sub.add_parser("artifacts", help="files runs wrote: list a run's, get one")
    actions = artifacts.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", parents=[client], help="the artifacts a run wrote")
    listing.add_argument("run_id", help="the run id (run_...)")
    listing.add_argument("--json", action="store_true", help="print JSON")
    get = actions.add_parser(
        "get", parents=[client], help="an artifact's versions, or its content with -o"
    )
    get.add_argument("artifact_id", help="the artifact id (art_...)")
    get.add_argument("--version", type=int, help="a version number (default: the latest)")
    get.add_argument("-o", "--output", help="write the content to this file (- for stdout)")
    get.add_argument("--json", action="store_true", help="print the record as JSON")
