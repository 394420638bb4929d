"""`agentrt users erase`, `agentrt conversations export|erase`, `agentrt audit`: over the API."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from server.client.follow import ClientConfig, check, open_client


def _print_erasure(erased: dict[str, Any]) -> None:
    counts = ", ".join(f"{k} {v}" for k, v in erased["counts"].items() if v) or "nothing left"
    print(f"erased {erased['scope']} {erased['subject']} ({erased['erasureId']}): {counts}")


async def cmd_users(settings: ClientConfig, args: argparse.Namespace) -> int:
    """`agentrt users erase USER [--cancel]` (tenant admins)."""
    params = {"cancel": "true"} if args.cancel else {}
    async with open_client(settings.url, settings.api_key) as client:
        erased = check(await client.delete(f"/api/users/{args.user_id}/data", params=params))
    _print_erasure(erased)
    return 0


async def cmd_conversations(settings: ClientConfig, args: argparse.Namespace) -> int:
    """`agentrt conversations export ID [-o FILE]` or `agentrt conversations erase ID`."""
    async with open_client(settings.url, settings.api_key) as client:
        if args.action == "erase":
            params = {"cancel": "true"} if args.cancel else {}
            path = f"/api/conversations/{args.conversation_id}"
            _print_erasure(check(await client.delete(path, params=params)))
            return 0
        path = f"/api/conversations/{args.conversation_id}/export"
        async with client.stream("GET", path) as response:
            if response.status_code >= 400:
                await response.aread()
                check(response)
            # Blocking writes are fine here: the command has nothing else to do meanwhile.
            out = open(args.output, "wb") if args.output else sys.stdout.buffer  # noqa: ASYNC230, SIM115
            try:
                async for chunk in response.aiter_bytes():
                    out.write(chunk)
            finally:
                if args.output:
                    out.close()
    return 0


async def cmd_audit(settings: ClientConfig, args: argparse.Namespace) -> int:
    """`agentrt audit [--action A] [--actor U] [--target T] [--tenant T] [--limit N]`."""
    params = {
        k: v
        for k, v in {
            "action": args.action,
            "actor": args.actor,
            "target": args.target,
            "tenant": args.tenant,
            "limit": args.limit,
        }.items()
        if v is not None
    }
    async with open_client(settings.url, settings.api_key) as client:
        entries = check(await client.get("/api/audit", params=params))["entries"]
    if args.json:
        print(json.dumps(entries, indent=2))
        return 0
    print(f"{'AT':<20} {'TENANT':<12} {'ACTOR':<14} {'ACTION':<22} {'TARGET':<34} DIFF")
    for e in entries:
        print(
            f"{e['at'][:19]:<20} {e['tenantId']:<12} {e['actor']:<14} {e['action']:<22} "
            f"{e['target']:<34} {json.dumps(e['diff'])}"
        )
    return 0


def add_lifecycle_parsers(sub: Any, client: argparse.ArgumentParser) -> None:
    """Add `agentrt users`, `agentrt conversations` and `agentrt audit` to the command line."""
    users = sub.add_parser("users", help="a user's data: erase it (tenant admins)")
    users_sub = users.add_subparsers(dest="action", required=True, metavar="ACTION")
    erase = users_sub.add_parser(
        "erase", parents=[client], help="erase everything of a user in your tenant, revoke keys"
    )
    erase.add_argument("user_id", help="the user's id")
    erase.add_argument("--cancel", action="store_true", help="cancel their runs in progress")

    conversations = sub.add_parser("conversations", help="export or erase a conversation")
    conv_sub = conversations.add_subparsers(dest="action", required=True, metavar="ACTION")
    export = conv_sub.add_parser(
        "export", parents=[client], help="write it as JSON lines (messages, runs, events, usage)"
    )
    export.add_argument("conversation_id", help="the conversation id (conv_...)")
    export.add_argument("-o", "--output", help="write to this file (default: standard output)")
    conv_erase = conv_sub.add_parser("erase", parents=[client], help="erase it and its runs")
    conv_erase.add_argument("conversation_id", help="the conversation id (conv_...)")
    conv_erase.add_argument("--cancel", action="store_true", help="cancel its run in progress")

    audit = sub.add_parser("audit", parents=[client], help="the audit log, newest first (admins)")
    audit.add_argument("--action", help="e.g. key.revoked, or key for every key action")
    audit.add_argument("--actor", help="who did it")
    audit.add_argument("--target", help="what it was done to (e.g. agent:support)")
    audit.add_argument("--tenant", help="operators: one tenant's rows")
    audit.add_argument("--limit", type=int, default=50, help="how many (default: 50)")
    audit.add_argument("--json", action="store_true", help="as JSON")
