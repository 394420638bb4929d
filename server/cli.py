"""The `agentrt` command: serve, run a message, inspect runs, manage keys and the database."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import Any

import httpx

from server.settings import Settings

TERMINAL = {"run.completed", "run.failed", "run.cancelled"}


def _setup_logging(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    for noisy in ("pgserver", "httpx", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


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
    uvicorn.run(create_app(settings), host=host, port=port, log_config=None)
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
        elif args.action == "events":
            if args.follow:
                await follow(client, args.run_id)
            else:
                async with client.stream("GET", f"/api/runs/{args.run_id}/events") as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            print(line[6:])
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
    from server.app import setup_checkpointer
    from server.db import migrate, open_pool, resolve_database_url

    url = resolve_database_url(settings)
    async with open_pool(url, settings.model_copy(update={"db_pool_min": 1})) as pool:
        applied = await migrate(pool)
        await setup_checkpointer(pool)
    print("applied: " + (", ".join(applied) or "nothing, schema is current"))
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
    events = runs_sub.add_parser("events")
    events.add_argument("run_id")
    events.add_argument("--follow", action="store_true", help="render live until the run ends")

    keys = sub.add_parser("keys", help="manage API keys")
    keys_sub = keys.add_subparsers(dest="action", required=True)
    create = keys_sub.add_parser("create")
    create.add_argument("--tenant", required=True)
    create.add_argument("--user", required=True)
    create.add_argument("--roles", default="", help="comma-separated, e.g. reviewer,admin")
    create.add_argument("--label")

    db = sub.add_parser("db", help="database maintenance")
    db.add_subparsers(dest="action", required=True).add_parser("migrate")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `agentrt` command."""
    args = build_parser().parse_args(argv)
    settings = Settings()
    _setup_logging(settings)
    if args.command == "serve":
        return cmd_serve(settings, args)
    handlers = {"run": cmd_run, "runs": cmd_runs, "keys": cmd_keys, "db": cmd_db}
    return asyncio.run(handlers[args.command](settings, args))


if __name__ == "__main__":
    raise SystemExit(main())
