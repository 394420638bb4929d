"""`agentrt agents ...` and the context view of `agentrt runs show ID --context`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import httpx
import yaml

from server.client.errors import ClientError
from server.client.follow import ClientConfig, check, open_client


def read_profile(path: str) -> dict[str, Any]:
    """Read a profile body from a YAML or JSON file.

    Raises:
        ClientError: the file cannot be read or is not a mapping.
    """
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ClientError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ClientError(f"{path} must hold a mapping of profile fields (name, instructions...)")
    return data


def print_agents(agents: list[dict[str, Any]]) -> None:
    """Print agents as a table with a header."""
    print(f"{'AGENT':<24} {'VERSION':>7}  {'SOURCE':<8} {'MODEL':<28} DESCRIPTION")
    for a in agents:
        spec = a["spec"]
        print(
            f"{a['name']:<24} {a['version']:>7}  {a['source']:<8} "
            f"{spec.get('model') or '(server default)':<28} {spec.get('description') or ''}"
        )


async def cmd_agents(settings: ClientConfig, args: argparse.Namespace) -> int:
    """`agentrt agents list|show|versions|create|update|delete`."""
    async with open_client(settings.url, settings.api_key) as client:
        try:
            if args.action == "list":
                print_agents(check(await client.get("/api/agents"))["agents"])
            elif args.action == "show":
                name, _, version = args.agent.partition("@")
                params = {"version": version} if version else {}
                found = check(await client.get(f"/api/agents/{name}", params=params))
                print(json.dumps(found, indent=2))
            elif args.action == "versions":
                found = check(await client.get(f"/api/agents/{args.name}/versions"))
                print_agents(found["versions"])
            elif args.action == "create":
                body = read_profile(args.file)
                if args.name:
                    body["name"] = args.name
                made = check(await client.post("/api/agents", json=body))
                print(f"agent {made['name']} created: version {made['version']}")
            elif args.action == "update":
                body = read_profile(args.file)
                body.pop("name", None)
                response = await client.put(f"/api/agents/{args.name}", json=body)
                made = check(response)
                new = response.headers.get("Agent-Version-Created") != "false"
                what = f"version {made['version']}" if new else "unchanged (no new version)"
                print(f"agent {made['name']}: {what}")
            elif args.action == "delete":
                response = await client.delete(f"/api/agents/{args.name}")
                if response.status_code >= 400:
                    check(response)
                print(f"agent {args.name} deleted; past runs keep their version")
        except httpx.ConnectError:
            raise ClientError(
                f"no server at {settings.url}; start one with 'make run', or point at yours "
                "with --url or AGENTRT_URL"
            ) from None
    return 0


def render_context(view: dict[str, Any]) -> str:
    """Render a run's context manifests for a terminal, one block per model call."""
    agent = view["agent"]
    lines = [f"run {view['runId']}: agent {agent['name']}@{agent['version']}"]
    if not view["manifests"]:
        lines.append("(no model call yet)")
    for m in view["manifests"]:
        lines.append("")
        lines.append(
            f"step {m['step']} attempt {m['attempt']}: {m['model']} "
            f"({m['tokenizer']}), {m['totalTokens']:,} of {m['available']:,} input tokens "
            f"(window {m['window']:,} - {m['reserveOutputTokens']:,} output - "
            f"{m['toolsTokens']:,} tools)"
        )
        lines.append(f"  {'SECTION':<14} {'TOKENS':>8} {'BUDGET':>8} {'ITEMS':>6}")
        for s in m["sections"]:
            budget = "-" if s.get("budget") is None else f"{s['budget']:,}"
            lines.append(f"  {s['name']:<14} {s['tokens']:>8,} {budget:>8} {s['items']:>6}")
        for d in m["dropped"]:
            what = (
                f"{d['turns']} turns / {d['messages']} messages"
                if "turns" in d
                else f"item {d.get('item', 'all')}"
            )
            summarised = ", summarised" if d.get("summarised") else ""
            lines.append(
                f"  dropped  {d['section']}: {what} ({d['tokens']:,} tokens{summarised}): "
                f"{d['reason']}"
            )
        for c in m["cut"]:
            where = c.get("messageId") or f"item {c.get('item')}"
            lines.append(
                f"  cut      {c['section']} {where}: {c['fromTokens']:,} -> "
                f"{c['toTokens']:,} tokens ({c['reason']})"
            )
        for d in m["deduplicated"]:
            lines.append(
                f"  removed  {d['section']} item {d['item']}: duplicate of {d['duplicateOf']}"
            )
        summary = m.get("summary")
        if summary:
            how = "made now" if summary["created"] else "reused"
            lines.append(
                f"  summary  covers the first {summary['covers']} messages, "
                f"{summary['tokens']:,} tokens, by {summary['model']} ({how})"
            )
    return "\n".join(lines)
