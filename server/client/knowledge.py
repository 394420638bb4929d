"""`agentrt kb ...`: knowledge bases and their documents, over the API."""

from __future__ import annotations

import argparse
import asyncio
import json
import mimetypes
from pathlib import Path
from typing import Any

from server.client.errors import ClientError
from server.client.follow import ClientConfig, check, open_client

BASE = "/api/knowledge-bases"


def _read(name: str) -> tuple[str, bytes]:
    path = Path(name)
    if not path.is_file():
        raise ClientError(f"{name}: no such file")
    return path.name, path.read_bytes()


def _print_documents(documents: list[dict[str, Any]]) -> None:
    print(f"{'ID':<40} {'STATUS':<11} {'CHUNKS':>11}  TITLE")
    for d in documents:
        progress = d["progress"]
        chunks = f"{progress['chunksDone']}/{progress['chunksTotal'] or '?'}"
        error = f"  ({d['error']})" if d.get("error") else ""
        print(f"{d['id']:<40} {d['status']:<11} {chunks:>11}  {d['title']}{error}")


async def _documents(client: Any, args: argparse.Namespace) -> None:
    base = f"{BASE}/{args.kb}/documents"
    if args.doc_action == "add":
        for name in args.files:
            file_name, content = await asyncio.to_thread(_read, name)
            media = mimetypes.guess_type(file_name)[0] or "application/octet-stream"
            if file_name.lower().endswith((".md", ".markdown")):
                media = "text/markdown"
            data = {"title": args.title} if args.title else {}
            response = await client.post(
                base, files={"file": (file_name, content, media)}, data=data
            )
            doc = check(response)
            note = " (already there)" if doc.get("duplicate") else ""
            print(f"{doc['id']} {doc['status']}{note}: {doc['title']}")
    elif args.doc_action == "add-url":
        doc = check(await client.post(f"{base}/from-url", json={"url": args.url}))
        print(f"{doc['id']} {doc['status']}: {doc['title']}")
    elif args.doc_action == "list":
        _print_documents(check(await client.get(base))["documents"])
    elif args.doc_action == "get":
        print(json.dumps(check(await client.get(f"{base}/{args.document_id}")), indent=2))
    elif args.doc_action == "reindex":
        doc = check(await client.post(f"{base}/{args.document_id}/reindex"))
        print(f"{doc['id']} {doc['status']}")
    elif args.doc_action == "rm":
        response = await client.delete(f"{base}/{args.document_id}")
        if response.status_code != 204:
            check(response)
        print(f"deleted {args.document_id}")


async def cmd_kb(settings: ClientConfig, args: argparse.Namespace) -> int:
    """`agentrt kb create|list|rm|search|docs ...`."""
    async with open_client(settings.url, settings.api_key) as client:
        if args.action == "create":
            body: dict[str, Any] = {
                "name": args.name,
                "chunking": {"targetTokens": args.target_tokens, "overlapTokens": args.overlap},
                "access": {"profiles": args.profile or [], "roles": args.role or []},
            }
            if args.embedding_model:
                body["embeddingModel"] = args.embedding_model
            made = check(await client.post(BASE, json=body))
            print(f"created {made['id']} ({made['name']}, {made['embeddingModel']})")
        elif args.action == "list":
            for kb in check(await client.get(BASE))["knowledgeBases"]:
                counts = f"{kb['documents']:>5} docs {kb['chunks']:>7} chunks"
                print(f"{kb['id']:<40} {kb['name']:<24} {counts}")
        elif args.action == "rm":
            response = await client.delete(f"{BASE}/{args.kb}")
            if response.status_code != 204:
                check(response)
            print(f"deleted {args.kb}")
        elif args.action == "search":
            found = check(
                await client.post(
                    f"{BASE}/{args.kb}/search", json={"query": args.query, "topK": args.top_k}
                )
            )["results"]
            for hit in found:
                where = " > ".join([hit["title"], *hit["headingPath"]])
                print(f"{hit['rank']:>2}. {hit['marker']} {where} ({hit['score']:.4f})")
                print(f"    {hit['text'][:200]}")
        else:
            await _documents(client, args)
    return 0


def add_kb_parser(sub: Any, client: argparse.ArgumentParser) -> None:
    """Add `agentrt kb ...` to the command line."""
    kb = sub.add_parser("kb", help="knowledge bases: create, list, rm, search, docs")
    actions = kb.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", parents=[client], help="create a knowledge base")
    create.add_argument("name", help="lowercase letters, digits, '-' and '_'")
    create.add_argument("--embedding-model", help="provider:model (the server's by default)")
    create.add_argument("--target-tokens", type=int, default=300, help="chunk size (300)")
    create.add_argument("--overlap", type=int, default=40, help="overlap in tokens (40)")
    create.add_argument("--profile", action="append", help="an agent that may search it")
    create.add_argument("--role", action="append", help="a role that may search it")
    actions.add_parser("list", parents=[client], help="the knowledge bases you may see")
    rm = actions.add_parser("rm", parents=[client], help="delete a knowledge base")
    rm.add_argument("kb", help="its id or name")
    search = actions.add_parser("search", parents=[client], help="search a knowledge base")
    search.add_argument("kb", help="its id or name")
    search.add_argument("query", help="what to look for")
    search.add_argument("--top-k", type=int, default=5, help="results (5)")
    docs = actions.add_parser("docs", help="a knowledge base's documents")
    doc_actions = docs.add_subparsers(dest="doc_action", required=True, metavar="ACTION")
    add = doc_actions.add_parser("add", parents=[client], help="upload files (txt, md, html, pdf)")
    add.add_argument("kb", help="its id or name")
    add.add_argument("files", nargs="+", help="files to upload")
    add.add_argument("--title", help="the title (the file name by default)")
    url = doc_actions.add_parser("add-url", parents=[client], help="fetch from an allowed host")
    url.add_argument("kb", help="its id or name")
    url.add_argument("url", help="http(s) URL on a host of AGENTRT_KNOWLEDGE_URL_ALLOWLIST")
    listing = doc_actions.add_parser("list", parents=[client], help="documents and progress")
    listing.add_argument("kb", help="its id or name")
    for name, text in (
        ("get", "one document"),
        ("reindex", "ingest a document again"),
        ("rm", "delete a document"),
    ):
        p = doc_actions.add_parser(name, parents=[client], help=text)
        p.add_argument("kb", help="its id or name")
        p.add_argument("document_id", help="doc_...")
