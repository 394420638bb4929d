"""The `agentrt` command: serve, run a message, inspect runs, manage keys and the database."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import httpx

from server.settings import Settings

TERMINAL = {"run.completed", "run.failed", "run.cancelled"}


def _setup_logging(settings: Settings) -> None:
    from server.logs import setup_logging

    setup_logging(settings.log_level, settings.log_format)


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    import uvicorn

    from server.app import create_app

    host = args.host or settings.host
    port = args.port or settings.port
    if args.no_workers:
        settings = settings.model_copy(update={"run_workers": False})
    print(f"agentrt: starting on http://{host}:{port} (model {settings.default_model})")
    print(
        f"  try:  curl -s -X POST http://{host}:{port}/api/conversations"
        " -H 'content-type: application/json' -d '{}'\n"
        "        then POST a message to it, or simply: .venv/bin/agentrt run 'what is 6*7?'",
        flush=True,
    )
    uvicorn.run(
        create_app(settings), host=host, port=port, log_config=None, timeout_graceful_shutdown=5
    )
    return 0


async def cmd_worker(settings: Settings, args: argparse.Namespace) -> int:
    import signal

    from server.app import build_tool_registry
    from server.models import ModelRegistry
    from server.runtime import open_runtime

    if args.concurrency:
        settings = settings.model_copy(update={"worker_concurrency": args.concurrency})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    models = ModelRegistry(settings)
    tools = build_tool_registry(settings)
    async with open_runtime(settings, models, tools, run_workers=True) as rt:
        assert rt.worker is not None
        if settings.metrics_port:
            from prometheus_client import start_http_server

            start_http_server(settings.metrics_port, registry=rt.metrics.registry)
        print(f"agentrt worker {rt.worker.owner} ready", flush=True)
        await stop.wait()
        print(f"agentrt worker {rt.worker.owner} draining", flush=True)
    return 0


def _client(settings: Settings) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    return httpx.AsyncClient(
        base_url=settings.url, headers=headers, timeout=httpx.Timeout(30, read=None)
    )


def _check(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text
        raise SystemExit(f"agentrt: {response.status_code}: {message}")
    return dict(response.json())


def render_event(event: dict[str, Any], out: Any = sys.stdout) -> None:
    """Print one event for a person watching a run in the terminal."""
    kind, data = event["type"], event["data"]
    if kind == "message.item.delta":
        out.write(data["delta"])
    elif kind == "message.item.completed":
        out.write("\n" if data.get("status") != "superseded" else "\n[superseded]\n")
    elif kind == "tool.started":
        out.write(f"  -> {data['name']}({json.dumps(data.get('args', {}))})\n")
    elif kind == "tool.completed":
        out.write(
            f"  <- {data['name']}: {str(data.get('output', ''))[:200]}"
            f" ({data.get('durationMs', 0):.0f} ms)\n"
        )
    elif kind == "tool.failed":
        out.write(f"  !! {data['name']} failed: {data.get('error')}\n")
    elif kind == "approval.required":
        out.write(
            f"[waiting for approval {data['approvalId']}: {data['name']}"
            f"({json.dumps(data.get('args', {}))}) - {data.get('reason', '')}]\n"
            f"[decide with: agentrt approve {data['approvalId']}  |  "
            f"agentrt reject {data['approvalId']} --reason ...]\n"
        )
    elif kind == "approval.resolved":
        out.write(f"[approval {data['approvalId']}: {data['status']} by {data.get('by')}]\n")
    elif kind == "model.retry":
        out.write(
            f"\n[{data.get('model')}: {data.get('errorClass')}; retry in {data.get('delayS')} s]\n"
        )
    elif kind == "model.fallback":
        out.write(
            f"\n[{data.get('fromModel')}: {data.get('errorClass')}; "
            f"falling back to {data.get('toModel')}]\n"
        )
    elif kind == "run.failed":
        out.write(f"[run failed: {data.get('errorType')}: {data.get('message')}]\n")
    elif kind == "run.cancelled":
        out.write("[run cancelled]\n")
    elif kind == "run.paused":
        out.write(f"[run paused; resume with: agentrt runs resume {event['runId']}]\n")
    elif kind == "run.resumed":
        out.write(f"[run resumed by {data.get('by')}]\n")
    elif kind in ("run.started", "run.requeued"):
        out.write(f"[{kind} attempt {data.get('attempt', '')}]\n".replace(" attempt ]", "]"))
    out.flush()


async def follow(client: httpx.AsyncClient, run_id: str, after: int = 0) -> str:
    """Render a run's events until its terminal event; return that event's type."""
    last = ""
    async with client.stream("GET", f"/api/runs/{run_id}/events", params={"after": after}) as r:
        if r.status_code >= 400:
            _check(httpx.Response(r.status_code, content=await r.aread()))
        buffer = ""
        async for text in r.aiter_text():
            buffer += text
            while "\n\n" in buffer:
                block, buffer = buffer.split("\n\n", 1)
                for line in block.split("\n"):
                    if line.startswith("data: "):
                        event = json.loads(line[6:])
                        render_event(event)
                        last = event["type"]
    return last


async def cmd_run(settings: Settings, args: argparse.Namespace) -> int:
    async with _client(settings) as client:
        try:
            if args.conversation:
                conv_id = args.conversation
            else:
                conv_id = _check(await client.post("/api/conversations", json={}))["conversationId"]
        except httpx.ConnectError:
            raise SystemExit(
                f"agentrt: no server at {settings.url}; start one with 'make run'"
            ) from None
        body: dict[str, Any] = {"content": args.message}
        if args.model:
            body["model"] = args.model
        run = _check(await client.post(f"/api/conversations/{conv_id}/messages", json=body))
        print(f"[run {run['runId']} in conversation {conv_id}]")
        last = await follow(client, run["runId"])
    return 0 if last == "run.completed" else 1


async def cmd_runs(settings: Settings, args: argparse.Namespace) -> int:
    async with _client(settings) as client:
        if args.action == "list":
            runs = _check(await client.get("/api/runs", params={"limit": args.limit}))["runs"]
            for r in runs:
                err = f"  {r['error']['type']}" if r["error"] else ""
                print(f"{r['runId']}  {r['status']:<12} {r['model']:<16} {r['createdAt']}{err}")
        elif args.action == "show":
            print(json.dumps(_check(await client.get(f"/api/runs/{args.run_id}")), indent=2))
        elif args.action == "trace":
            from server.traces import render_tree

            print(render_tree(_check(await client.get(f"/api/runs/{args.run_id}/trace"))))
        elif args.action in ("pause", "resume"):
            print(await pause_or_resume(client, args.action, args.run_id))
        elif args.action == "events":
            if args.follow:
                await follow(client, args.run_id)
            else:
                async with client.stream("GET", f"/api/runs/{args.run_id}/events") as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            print(line[6:])
    return 0


async def pause_or_resume(client: httpx.AsyncClient, action: str, run_id: str) -> str:
    """Pause or resume a run; return a line saying where it stands."""
    run = _check(await client.post(f"/api/runs/{run_id}/{action}"))
    if action == "resume":
        return f"run {run_id} resumed: {run['status']}"
    if run["status"] == "paused":
        return f"run {run_id} paused; resume it with 'agentrt runs resume {run_id}'"
    return f"run {run_id} pauses at its next step (now {run['status']})"


def add_pause_commands(runs_sub: Any) -> None:
    """Add `runs pause ID` and `runs resume ID`."""
    pause = runs_sub.add_parser(
        "pause", help="pause a run at its next step (the worker is freed until resumed)"
    )
    pause.add_argument("run_id", help="the run to pause")
    resume = runs_sub.add_parser("resume", help="resume a paused run from its last checkpoint")
    resume.add_argument("run_id", help="the run to resume")


def _print_approval(a: dict[str, Any], out: Any = None) -> None:
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


async def cmd_approvals(settings: Settings, args: argparse.Namespace) -> int:
    """`agentrt approvals list`, `agentrt approve ID`, `agentrt reject ID --reason ...`."""
    async with _client(settings) as client:
        if args.command == "approvals":
            params: dict[str, Any] = {"limit": args.limit}
            if args.status != "all":
                params["status"] = args.status
            approvals = _check(await client.get("/api/approvals", params=params))["approvals"]
            for a in approvals:
                _print_approval(a)
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
                raise SystemExit(f"agentrt: --args is not valid JSON: {exc}") from None
        decided = _check(await client.post(f"/api/approvals/{args.approval_id}", json=body))
        _print_approval(decided)
    return 0


async def cmd_keys(settings: Settings, args: argparse.Namespace) -> int:
    from server.auth import create_api_key
    from server.db import migrate, open_pool, resolve_database_url

    url = resolve_database_url(settings)
    async with open_pool(url, settings.model_copy(update={"db_pool_min": 1})) as pool:
        await migrate(pool)
        roles = [r for r in args.roles.split(",") if r]
        key = await create_api_key(pool, args.tenant, args.user, roles, args.label)
    print(key)
    return 0


async def cmd_db(settings: Settings, args: argparse.Namespace) -> int:
    from server.db import migrate, open_pool, resolve_database_url
    from server.maintenance import prune_checkpoints
    from server.runtime import setup_checkpointer

    url = resolve_database_url(settings)
    async with open_pool(url, settings.model_copy(update={"db_pool_min": 1})) as pool:
        applied = await migrate(pool)
        checkpointer = await setup_checkpointer(pool)
        if args.action == "migrate":
            print("applied: " + (", ".join(applied) or "nothing, schema is current"))
        else:
            days = settings.checkpoint_retention_days if args.days is None else args.days
            count = await prune_checkpoints(pool, checkpointer, retention_days=days)
            print(f"pruned the checkpoints of {count} conversations idle for {days:g} days")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agentrt", description="A production runtime for LLM agents."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="start the API server (and in-process workers)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--no-workers", action="store_true", help="API only; run workers elsewhere")

    run = sub.add_parser("run", help="send a message and watch the run live")
    run.add_argument("message")
    run.add_argument("--model")
    run.add_argument("--conversation", help="continue this conversation")

    runs = sub.add_parser("runs", help="inspect runs")
    runs_sub = runs.add_subparsers(dest="action", required=True)
    runs_list = runs_sub.add_parser("list")
    runs_list.add_argument("--limit", type=int, default=20)
    runs_sub.add_parser("show").add_argument("run_id")
    runs_sub.add_parser("trace", help="print the run's trace as a tree").add_argument("run_id")
    events = runs_sub.add_parser("events")
    events.add_argument("run_id")
    events.add_argument("--follow", action="store_true", help="render live until the run ends")
    add_pause_commands(runs_sub)

    approvals = sub.add_parser("approvals", help="list tool calls waiting for a decision")
    approvals_sub = approvals.add_subparsers(dest="action", required=True)
    approvals_list = approvals_sub.add_parser("list")
    approvals_list.add_argument(
        "--status",
        default="pending",
        choices=["pending", "approved", "rejected", "edited", "expired", "cancelled", "all"],
    )
    approvals_list.add_argument("--limit", type=int, default=100)
    approve = sub.add_parser("approve", help="approve a pending tool call (reviewers)")
    approve.add_argument("approval_id")
    approve.add_argument("--reason")
    approve.add_argument("--args", help="run the call with these arguments instead (JSON)")
    reject = sub.add_parser("reject", help="reject a pending tool call (reviewers)")
    reject.add_argument("approval_id")
    reject.add_argument("--reason", required=True, help="why; the model reads it")

    keys = sub.add_parser("keys", help="manage API keys")
    keys_sub = keys.add_subparsers(dest="action", required=True)
    create = keys_sub.add_parser("create")
    create.add_argument("--tenant", required=True)
    create.add_argument("--user", required=True)
    create.add_argument("--roles", default="", help="comma-separated, e.g. reviewer,admin")
    create.add_argument("--label")

    worker = sub.add_parser("worker", help="run workers only (any number, on any machine)")
    worker.add_argument("--concurrency", type=int, help="runs at a time in this process")

    db = sub.add_parser("db", help="database maintenance")
    db_sub = db.add_subparsers(dest="action", required=True)
    db_sub.add_parser("migrate", help="apply schema migrations")
    prune = db_sub.add_parser("prune", help="keep only the latest checkpoint of idle conversations")
    prune.add_argument("--days", type=float, help="idle for this long (default: the setting)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `agentrt` command."""
    args = build_parser().parse_args(argv)
    settings = Settings()
    _setup_logging(settings)
    if args.command == "serve":
        return cmd_serve(settings, args)
    handlers = {
        "run": cmd_run,
        "runs": cmd_runs,
        "approvals": cmd_approvals,
        "approve": cmd_approvals,
        "reject": cmd_approvals,
        "keys": cmd_keys,
        "db": cmd_db,
        "worker": cmd_worker,
    }
    return asyncio.run(handlers[args.command](settings, args))


if __name__ == "__main__":
    raise SystemExit(main())
