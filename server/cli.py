"""The `agentrt` command: serve, run a message, inspect runs, manage keys and the database.

Heavy modules (the app, LangGraph, uvicorn, httpx) are imported inside the commands that need
them, so that `agentrt --help` and the client commands start quickly.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import ValidationError

    from server.settings import Settings
    from server.usage.registry import ModelRegistry

DEFAULT_URL = "http://127.0.0.1:8000"
CLIENT = {"run", "runs", "approvals", "approve", "reject", "agents", "memory", "kb"}
CLIENT |= {"artifacts", "skills", "users", "conversations", "audit"}


def _setup_logging(settings: Settings) -> None:
    from server.observability.logs import setup_logging

    setup_logging(settings.log_level, settings.log_format)


def _tools(settings: Settings) -> list[Any]:
    """Load the built-in tools and `AGENTRT_TOOL_MODULES`, or raise StartupError."""
    from server.app import default_tools
    from server.errors import StartupError

    # A console script does not put the working directory on sys.path as `python -m` does;
    # appended (not prepended) so that a local file cannot shadow an installed module.
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        return default_tools(settings)
    except (ImportError, AttributeError, TypeError) as exc:
        raise StartupError(
            f"AGENTRT_TOOL_MODULES={','.join(settings.tool_modules)}: {exc} (entries are "
            "'module:attribute', comma-separated; the module must be importable from the "
            "working directory or the virtualenv; see docs/tools.md)"
        ) from None


def _models(settings: Settings) -> ModelRegistry:
    """Build the model registry and check the default model, or raise StartupError."""
    import logging
    import threading

    from server.errors import StartupError, UnknownModelError
    from server.usage.registry import ModelRegistry

    # Validating a litellm model imports litellm, seconds on a busy machine: say so if slow.
    slow = threading.Timer(
        1.0, logging.getLogger("agentrt").info, ["start-up: waiting for the model check"]
    )
    slow.start()
    try:
        models = ModelRegistry(settings)
        models.validate(settings.default_model)
    except UnknownModelError as exc:
        raise StartupError(f"AGENTRT_DEFAULT_MODEL={settings.default_model}: {exc}") from None
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    finally:
        slow.cancel()
    return models


def _try_command(host: str, port: int) -> str:
    """A command that reaches this server from the same machine, as it was invoked."""
    program = "agentrt" if os.path.basename(sys.argv[0]) == "agentrt" else "python -m server.cli"
    if program == "agentrt" and os.path.dirname(sys.argv[0]):
        program = os.path.relpath(sys.argv[0]) if sys.argv[0].startswith(os.getcwd()) else program
    local = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    url = f"http://{local}:{port}" if ":" not in local else f"http://[{local}]:{port}"
    flag = "" if url == DEFAULT_URL else f" --url {url}"
    return f"{program}{flag} run {shlex.quote('what is 6*7?')}"


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    """Check the port, database, model and tools, then serve the API (and workers)."""
    import asyncio

    from server.startup import bind_port, check_database

    host = args.host or settings.host
    port = settings.port if args.port is None else args.port
    sock = bind_port(host, port)  # first: a busy port must not start workers at all
    port = sock.getsockname()[1]
    if settings.database_url:
        asyncio.run(check_database(settings.database_url))
    if args.no_workers:
        settings = settings.model_copy(update={"run_workers": False})
    models = _models(settings)
    tools = _tools(settings)
    from server.agents.files import check_agent_files

    check_agent_files(settings)

    import uvicorn

    from server.app import create_app
    from server.loops import http_parser, resolve_loop
    from server.serving import DrainingServer

    loop = resolve_loop(settings.event_loop)
    app = create_app(settings, models=models, tools=tools)
    print(
        f"agentrt: starting on http://{host}:{port} (model {settings.default_model}, "
        f"event loop {loop})"
    )
    print(f"  try:  {_try_command(host, port)}", flush=True)
    config = uvicorn.Config(
        app,
        loop=loop,
        http=http_parser(),
        log_config=None,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=settings.http_keep_alive_s,
    )
    DrainingServer(config, app).run(sockets=[sock])
    return 0


async def cmd_worker(settings: Settings, args: argparse.Namespace) -> int:
    """Run workers only until SIGTERM or SIGINT; a second signal hands runs back at once."""
    import asyncio
    import signal

    from server.app import build_tool_registry
    from server.process import open_runtime

    if args.concurrency:
        settings = settings.model_copy(update={"worker_concurrency": args.concurrency})
    models = _models(settings)
    tools = build_tool_registry(settings, _tools(settings))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    async with open_runtime(settings, models, tools, run_workers=True, serves_streams=False) as rt:
        assert rt.worker is not None

        def on_signal() -> None:
            rt.request_stop()
            stop.set()

        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, on_signal)
        if settings.metrics_port:
            from prometheus_client import start_http_server

            start_http_server(settings.metrics_port, registry=rt.metrics.registry)
        print(f"agentrt worker {rt.worker.owner} ready", flush=True)
        await stop.wait()
        print(f"agentrt worker {rt.worker.owner} draining", flush=True)
    return 0


async def _with_pool(settings: Settings, action: Any) -> Any:
    from server.db.pool import database_url, migrate, open_pool

    async with (
        database_url(settings) as url,
        open_pool(url, settings.model_copy(update={"db_pool_min": 1})) as pool,
    ):
        await migrate(pool)
        return await action(pool)


async def cmd_keys(settings: Settings, args: argparse.Namespace) -> int:
    """Create, list and revoke API keys (directly in the database: an operator's command)."""
    from server.auth import create_api_key, list_api_keys, revoke_api_key

    if args.action == "create":
        roles = [r for r in args.roles.split(",") if r]
        key = await _with_pool(
            settings, lambda pool: create_api_key(pool, args.tenant, args.user, roles, args.label)
        )
        print(key)
    elif args.action == "list":
        keys = await _with_pool(settings, lambda pool: list_api_keys(pool, args.tenant))
        print(f"{'ID':<30} {'TENANT':<14} {'USER':<14} {'ROLES':<16} {'CREATED':<17} STATE")
        for k in keys:
            state = f"revoked {k['revoked_at']:%Y-%m-%d %H:%M}" if k["revoked_at"] else "active"
            print(
                f"{k['id']:<30} {k['tenant_id']:<14} {k['user_id']:<14} "
                f"{','.join(k['roles']) or '-':<16} {k['created_at']:%Y-%m-%d %H:%M} {state}"
                + (f"  ({k['label']})" if k["label"] else "")
            )
    else:
        revoked = await _with_pool(settings, lambda pool: revoke_api_key(pool, args.key_id))
        if not revoked:
            print(f"agentrt: no active key {args.key_id}", file=sys.stderr)
            return 1
        print(f"revoked {args.key_id}")
    return 0


async def cmd_db(settings: Settings, args: argparse.Namespace) -> int:
    """Migrate, prune checkpoints, or stop the embedded database."""
    if args.action == "stop":
        return _db_stop(settings, args.force)
    from server.db.maintenance import prune_checkpoints
    from server.process import setup_checkpointer

    async def act(pool: Any) -> str:
        if args.action == "analyst-role":
            from server.memory.analysts import create_analyst_role

            password = await create_analyst_role(pool, args.name, args.password)
            return (
                f"role {args.name} may read the views analytics_memories, "
                f"analytics_memory_jobs, analytics_embedding_calls; password: {password}"
            )
        checkpointer = await setup_checkpointer(pool)
        if args.action == "migrate":
            return "schema is current"
        days = settings.checkpoint_retention_days if args.days is None else args.days
        count = await prune_checkpoints(pool, checkpointer, retention_days=days)
        from server.artifacts.retention import prune_artifacts
        from server.artifacts.storage import make_storage
        from server.memory.store import prune_expired_memories

        expired = await prune_expired_memories(pool)
        versions = await prune_artifacts(pool, make_storage(settings), settings)
        from server.lifecycle.retention import apply_retention

        removed = await apply_retention(pool, settings)
        lifecycle = (
            "another process is applying the retention"
            if removed is None
            else f"retention: {removed.expired_runs} event logs expired, {removed.events} events, "
            f"{removed.spans} spans, {removed.payloads} payloads, {removed.ledger} ledger rows "
            f"(rolled up per day), {removed.audit} audit rows removed; "
            f"{len(removed.partitions_dropped)} partitions dropped, "
            f"{removed.partitions_created} created"
            + (
                f"; {', '.join(removed.partitions_deferred)} in use, left for the next pass"
                if removed.partitions_deferred
                else ""
            )
        )
        return (
            f"pruned the checkpoints of {count} conversations idle for {days:g} days;"
            f" deleted {expired} expired memories;"
            f" deleted {versions} artifact versions past their retention; {lifecycle}"
        )

    print(await _with_pool(settings, act))
    return 0


def _db_stop(settings: Settings, force: bool) -> int:
    from server.db import embedded

    if settings.database_url:
        print("agentrt: DATABASE_URL is set; there is no embedded database to stop")
        return 1
    stopped, users = embedded.stop(settings.data_dir, force=force)
    if users and not force:
        print(
            f"agentrt: the embedded database is in use by pid(s) {', '.join(map(str, users))};"
            " stop them first, or pass --force",
            file=sys.stderr,
        )
        return 1
    print("stopped the embedded database" if stopped else "the embedded database is not running")
    return 0


def _describe_settings_error(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        name = str(error["loc"][0]) if error["loc"] else "settings"
        variable = name.upper() if name == "DATABASE_URL" else f"AGENTRT_{name.upper()}"
        parts.append(f"{variable}: {error['msg']}")
    return "; ".join(parts)


def _run_continues(run_id: str) -> str:
    return (
        f"\nagentrt: stopped watching; run {run_id} continues on the server.\n"
        f"  follow it:  agentrt runs events {run_id} --follow\n"
        f"  cancel it:  agentrt runs cancel {run_id}"
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `agentrt` command."""
    from server.client.parser import build_parser

    args = build_parser().parse_args(argv)
    import asyncio

    from server.client.errors import ClientError
    from server.errors import StartupError

    if args.command in CLIENT:
        from server.client.commands import CLIENT_COMMANDS
        from server.client.follow import ClientConfig

        config = ClientConfig.load(getattr(args, "url", None), getattr(args, "api_key", None))
        try:
            return asyncio.run(CLIENT_COMMANDS[args.command](config, args))
        except ClientError as exc:
            print(f"agentrt: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            run_id = getattr(args, "watching", None)
            print(_run_continues(run_id) if run_id else "", file=sys.stderr)
            return 130

    from pydantic import ValidationError

    from server.settings import Settings

    try:
        settings = Settings()
    except ValidationError as exc:
        print(f"agentrt: invalid configuration: {_describe_settings_error(exc)}", file=sys.stderr)
        return 2
    _setup_logging(settings)
    try:
        if args.command == "serve":
            return cmd_serve(settings, args)
        from server.loops import run

        handlers = {"keys": cmd_keys, "db": cmd_db, "worker": cmd_worker}
        return run(handlers[args.command](settings, args), settings.event_loop)
    except StartupError as exc:
        print(f"agentrt: cannot start: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
