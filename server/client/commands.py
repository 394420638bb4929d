"""The `agentrt` commands that talk to a server: run, runs, approvals, approve, reject."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TextIO

import httpx

from server.client.agents import cmd_agents, render_context
from server.client.artifacts import cmd_artifacts
from server.client.errors import ClientError
from server.client.follow import ClientConfig, Renderer, check, describe_event, follow, open_client
from server.client.knowledge import cmd_kb
from server.client.lifecycle import cmd_audit, cmd_conversations, cmd_users
from server.client.memory import cmd_memory
from server.client.skills import cmd_skills
from server.client.tree import load_tree, render_run_tree


def _unreachable(settings: ClientConfig) -> ClientError:
    return ClientError(
        f"no server at {settings.url}; start one with 'make run', or point at yours with"
        " --url or AGENTRT_URL"
    )


async def cmd_run(settings: ClientConfig, args: argparse.Namespace) -> int:
    """Send a message, then render the run live until it ends, reconnecting as needed."""
    async with open_client(settings.url, settings.api_key) as client:
        try:
            if args.conversation:
                conv_id = args.conversation
            else:
                conv_id = check(await client.post("/api/conversations", json={}))["conversationId"]
        except httpx.ConnectError:
            raise _unreachable(settings) from None
        body: dict[str, Any] = {"content": args.message}
        if args.model:
            body["model"] = args.model
        if args.agent:
            body["agent"] = args.agent
        run = check(await client.post(f"/api/conversations/{conv_id}/messages", json=body))
        args.watching = run["runId"]  # for the Ctrl-C message in main()
        print(f"[run {run['runId']} in conversation {conv_id}]", flush=True)
        last = await follow(client, run["runId"], Renderer().event)
    return 0 if last == "run.completed" else 1


def print_runs(runs: list[dict[str, Any]], out: TextIO | None = None) -> None:
    """Print runs as a table with a header."""
    out = out or sys.stdout
    out.write(f"{'RUN':<30} {'STATUS':<13} {'MODEL':<20} {'CREATED':<20} ERROR\n")
    for r in runs:
        err = f"{r['error']['type']}" if r.get("error") else ""
        out.write(
            f"{r['runId']:<30} {r['status']:<13} {r['model']:<20} {r['createdAt'][:19]:<20} {err}\n"
        )
    if not runs:
        out.write("(no runs yet)\n")


async def _events(client: httpx.AsyncClient, args: argparse.Namespace) -> None:
    if args.follow:
        render = (lambda e: print(json.dumps(e), flush=True)) if args.json else Renderer().event
        await follow(client, args.run_id, render)
        return
    async with client.stream("GET", f"/api/runs/{args.run_id}/events") as response:
        if response.status_code >= 400:
            check(httpx.Response(response.status_code, content=await response.aread()))
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                print(line[6:] if args.json else describe_event(json.loads(line[6:])))
            elif line.startswith(":"):
                continue


async def cmd_runs(settings: ClientConfig, args: argparse.Namespace) -> int:
    """`agentrt runs list|show|trace|events|cancel|pause|resume|retry`."""
    async with open_client(settings.url, settings.api_key) as client:
        try:
            if args.action == "list":
                print_runs(
                    check(await client.get("/api/runs", params={"limit": args.limit}))["runs"]
                )
            elif args.action == "show":
                run = check(await client.get(f"/api/runs/{args.run_id}"))
                print(json.dumps(run, indent=2))
                tree = await load_tree(client, run)
                if tree["children"]:
                    print("\nsubagents:\n" + render_run_tree(tree))
                if args.context:
                    view = check(await client.get(f"/api/runs/{args.run_id}/context"))
                    print(render_context(view))
            elif args.action == "trace":
                from server.observability.traces import render_tree

                print(render_tree(check(await client.get(f"/api/runs/{args.run_id}/trace"))))
            elif args.action == "events":
                await _events(client, args)
            elif args.action == "cancel":
                run = check(await client.post(f"/api/runs/{args.run_id}/cancel"))
                done = "cancelled" if run.get("cancelled") else "cancel requested; it stops soon"
                print(f"run {args.run_id}: {done} (status {run['status']})")
            elif args.action == "retry":
                run = check(await client.post(f"/api/runs/{args.run_id}/retry"))
                print(f"run {args.run_id} retried as {run['runId']} (status {run['status']})")
            elif args.action in ("pause", "resume"):
                print(await pause_or_resume(client, args.action, args.run_id))
        except httpx.ConnectError:
            raise _unreachable(settings) from None
    return 0


async def pause_or_resume(client: httpx.AsyncClient, action: str, run_id: str) -> str:
    """Pause or resume a run; return a line saying where it stands."""
    run = check(await client.post(f"/api/runs/{run_id}/{action}"))
    if action == "resume":
        return f"run {run_id} resumed: {run['status']}"
    if run["status"] == "paused":
        return f"run {run_id} paused; resume it with 'agentrt runs resume {run_id}'"
    return f"run {run_id} pauses at its next step (now {run['status']})"


def print_approval(a: dict[str, Any], out: TextIO | None = None) -> None:
    """Print one approval and, once decided, its decision."""
    out = out or sys.stdout
    decided = ""
    if a.get("decision"):
        d = a["decision"]
        decided = f"  {d['decision']} by {d['by']}" + (f": {d['reason']}" if d["reason"] else "")
    out.write(
        f"{a['approvalId']}  {a['status']:<9} {a['kind']:<9} {a['risk'] or '-':<6} "
        f"run {a['runId']}  {a['tool']}({json.dumps(a['args'])}){decided}\n"
        f"    {a['reason']}\n"
    )


async def cmd_approvals(settings: ClientConfig, args: argparse.Namespace) -> int:
    """`agentrt approvals list`, `agentrt approve ID`, `agentrt reject ID --reason ...`."""
    async with open_client(settings.url, settings.api_key) as client:
        if args.command == "approvals":
            params: dict[str, Any] = {"limit": args.limit}
            if args.status != "all":
                params["status"] = args.status
            approvals = check(await client.get("/api/approvals", params=params))["approvals"]
            for a in approvals:
                print_approval(a)
            if not approvals:
                print(f"no {args.status} approvals")
            return 0
        body: dict[str, Any] = {"decision": "reject" if args.command == "reject" else "approve"}
        if args.reason:
            body["reason"] = args.reason
        if args.command == "approve" and args.args is not None:
            body["decision"] = "edit"
            try:
                body["args"] = json.loads(args.args)
            except ValueError as exc:
                raise ClientError(f"--args is not valid JSON: {exc}") from None
        print_approval(check(await client.post(f"/api/approvals/{args.approval_id}", json=body)))
    return 0


CLIENT_COMMANDS: dict[
    str, Callable[[ClientConfig, argparse.Namespace], Coroutine[Any, Any, int]]
] = {
    "run": cmd_run,
    "runs": cmd_runs,
    "approvals": cmd_approvals,
    "approve": cmd_approvals,
    "reject": cmd_approvals,
    "agents": cmd_agents,
    "memory": cmd_memory,
    "artifacts": cmd_artifacts,
    "skills": cmd_skills,
    "users": cmd_users,
    "conversations": cmd_conversations,
    "audit": cmd_audit,
    "kb": cmd_kb,
}
