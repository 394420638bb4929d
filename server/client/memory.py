"""`agentrt memory list|search|add|rm`: the memories the caller may see, over the API."""

from __future__ import annotations

import argparse
import json
from typing import Any

from server.client.follow import ClientConfig, check, open_client


def print_memories(memories: list[dict[str, Any]]) -> None:
    """Print memories as a table with a header."""
    print(f"{'ID':<26} {'USER':<14} {'KIND':<12} {'SCORE':>6}  TEXT")
    for m in memories:
        score = m.get("similarity")
        print(
            f"{m['id']:<26} {m.get('userId') or '(shared)':<14} {m['kind']:<12} "
            f"{'' if score is None else format(score, '.3f'):>6}  {m['text']}"
        )


async def cmd_memory(settings: ClientConfig, args: argparse.Namespace) -> int:
    """`agentrt memory list|search|add|rm`."""
    params: dict[str, Any] = {}
    if getattr(args, "user", None):
        params["userId"] = args.user
    async with open_client(settings.url, settings.api_key) as client:
        if args.action in ("list", "search"):
            if args.action == "search":
                params["q"] = args.query
            if args.kind:
                params["kind"] = args.kind
            params["limit"] = args.limit
            found = check(await client.get("/api/memories", params=params))["memories"]
            if args.json:
                print(json.dumps(found, indent=2))
            else:
                print_memories(found)
        elif args.action == "add":
            body = {"text": args.text, "kind": args.kind, "scope": args.scope}
            if args.user:
                body["userId"] = args.user
            if args.expires_in_days:
                body["expiresInDays"] = args.expires_in_days
            made = check(await client.post("/api/memories", json=body))
            print(f"remembered {made['id']}: {made['text']}")
        elif args.action == "rm":
            if args.all:
                gone = check(await client.request("DELETE", "/api/memories", params=params))
                print(f"forgot {gone['deleted']} memories")
            else:
                if not args.memory_id:
                    print("agentrt: name a memory id, or --all to forget everything")
                    return 2
                response = await client.delete(f"/api/memories/{args.memory_id}", params=params)
                if response.status_code != 204:
                    check(response)
                print(f"forgot {args.memory_id}")
    return 0


def add_memory_parser(sub: Any, client: argparse.ArgumentParser) -> None:
    """Add `agentrt memory ...` to the command line."""
    memory = sub.add_parser("memory", help="long-term memories: list, search, add, rm")
    actions = memory.add_subparsers(dest="action", required=True, metavar="ACTION")
    kinds = ["fact", "preference", "instruction", "episode"]
    for name, text in (("list", "newest first"), ("search", "most similar to a text first")):
        p = actions.add_parser(name, parents=[client], help=f"memories you may see, {text}")
        if name == "search":
            p.add_argument("query", help="what to look for")
        p.add_argument("--user", help="whose memories (admins); yours by default")
        p.add_argument("--kind", choices=kinds, help="only memories of this kind")
        p.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
        p.add_argument("--json", action="store_true", help="print JSON")
    add = actions.add_parser("add", parents=[client], help="remember something")
    add.add_argument("text", help="what to remember, one self-contained sentence")
    add.add_argument("--kind", choices=kinds, default="fact", help="default: fact")
    add.add_argument(
        "--scope",
        choices=["user", "tenant"],
        default="user",
        help="user (default) or tenant: shared with the whole tenant (admins)",
    )
    add.add_argument("--user", help="for another user (admins)")
    add.add_argument("--expires-in-days", type=float, help="forget it after this many days")
    rm = actions.add_parser("rm", parents=[client], help="forget a memory (or --all of a user's)")
    rm.add_argument("memory_id", nargs="?", help="the memory's id (mem_...)")
    rm.add_argument("--user", help="another user's (admins)")
    rm.add_argument("--all", action="store_true", help="forget everything about the user")
