"""The `agentrt` command line: every command, option and its help text.

Kept apart from the commands so that `agentrt --help` imports nothing but argparse.
"""

from __future__ import annotations

import argparse
from typing import Any

from server.client.artifacts import add_artifacts_parser
from server.client.knowledge import add_kb_parser
from server.client.lifecycle import add_lifecycle_parsers
from server.client.memory import add_memory_parser
from server.client.skills import add_skills_parser

APPROVAL_STATES = ["pending", "approved", "rejected", "edited", "expired", "cancelled", "all"]


def _client_options() -> argparse.ArgumentParser:
    """--url and --api-key, accepted before or after the command."""
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help="server to talk to (default: $AGENTRT_URL or http://127.0.0.1:8000)",
    )
    options.add_argument(
        "--api-key",
        default=argparse.SUPPRESS,
        help="API key to send as a bearer token (default: $AGENTRT_API_KEY)",
    )
    return options


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of the `agentrt` command."""
    client = _client_options()
    parser = argparse.ArgumentParser(
        prog="agentrt", description="A production runtime for LLM agents.", parents=[client]
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="start the API server (and in-process workers)")
    serve.add_argument("--host", help="address to listen on (default: $AGENTRT_HOST, 127.0.0.1)")
    serve.add_argument(
        "--port",
        type=int,
        help="port to listen on, 0 for any free one (default: $AGENTRT_PORT, 8000)",
    )
    serve.add_argument("--no-workers", action="store_true", help="API only; run workers elsewhere")

    run = sub.add_parser("run", parents=[client], help="send a message and watch the run live")
    run.add_argument("message", help="the user message")
    run.add_argument(
        "--model", help="model for this run, as provider:model (default: the server's)"
    )
    run.add_argument("--conversation", help="continue this conversation (id) instead of a new one")
    run.add_argument("--agent", help="agent profile for this run: NAME or NAME@VERSION")

    runs = sub.add_parser("runs", help="inspect, cancel, pause and resume runs")
    runs_sub = runs.add_subparsers(dest="action", required=True, metavar="ACTION")
    runs_list = runs_sub.add_parser("list", parents=[client], help="the latest runs, newest first")
    runs_list.add_argument("--limit", type=int, default=20, help="how many (default: 20)")
    show = runs_sub.add_parser(
        "show", parents=[client], help="the run record as JSON, and its subagents as a tree"
    )
    show.add_argument("run_id", help="the run id (run_...)")
    show.add_argument(
        "--context",
        action="store_true",
        help="also what each model call was sent: sections, tokens, what was dropped and why",
    )
    trace = runs_sub.add_parser("trace", parents=[client], help="print the run's trace as a tree")
    trace.add_argument("run_id", help="the run id (run_...)")
    events = runs_sub.add_parser("events", parents=[client], help="the run's event log")
    events.add_argument("run_id", help="the run id (run_...)")
    events.add_argument("--follow", action="store_true", help="render live until the run ends")
    events.add_argument("--json", action="store_true", help="one JSON event per line")
    cancel = runs_sub.add_parser("cancel", parents=[client], help="cancel a run")
    cancel.add_argument("run_id", help="the run id (run_...)")
    pause = runs_sub.add_parser(
        "pause", parents=[client], help="pause a run at its next step (its worker is freed)"
    )
    pause.add_argument("run_id", help="the run id (run_...)")
    resume = runs_sub.add_parser(
        "resume", parents=[client], help="resume a paused run from its last checkpoint"
    )
    resume.add_argument("run_id", help="the run id (run_...)")
    retry = runs_sub.add_parser(
        "retry",
        parents=[client],
        help="run a finished subagent's task again as a new child run of the same parent",
    )
    retry.add_argument("run_id", help="the child run id (run_...)")

    _agents_parser(sub, client)
    add_memory_parser(sub, client)
    add_artifacts_parser(sub, client)
    add_skills_parser(sub, client)
    add_lifecycle_parsers(sub, client)
    add_kb_parser(sub, client)

    approvals = sub.add_parser("approvals", help="list tool calls waiting for a decision")
    approvals_sub = approvals.add_subparsers(dest="action", required=True, metavar="ACTION")
    approvals_list = approvals_sub.add_parser("list", parents=[client], help="list approvals")
    approvals_list.add_argument(
        "--status", default="pending", choices=APPROVAL_STATES, help="which (default: pending)"
    )
    approvals_list.add_argument("--limit", type=int, default=100, help="how many (default: 100)")
    approve = sub.add_parser(
        "approve", parents=[client], help="approve a pending tool call (reviewers)"
    )
    approve.add_argument("approval_id", help="the approval id (apr_...)")
    approve.add_argument("--reason", help="why; recorded and shown to the model")
    approve.add_argument("--args", help="run the call with these arguments instead (JSON)")
    reject = sub.add_parser(
        "reject", parents=[client], help="reject a pending tool call (reviewers)"
    )
    reject.add_argument("approval_id", help="the approval id (apr_...)")
    reject.add_argument("--reason", required=True, help="why; the model reads it")

    keys = sub.add_parser("keys", help="manage API keys (works on the database directly)")
    keys_sub = keys.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = keys_sub.add_parser("create", help="create a key and print it (shown once)")
    create.add_argument("--tenant", required=True, help="tenant the key acts in")
    create.add_argument("--user", required=True, help="user the key acts as")
    create.add_argument("--roles", default="", help="comma-separated, e.g. reviewer,admin")
    create.add_argument("--label", help="a note to recognise the key by")
    keys_list = keys_sub.add_parser("list", help="list keys (never their secrets)")
    keys_list.add_argument("--tenant", help="only this tenant's keys")
    revoke = keys_sub.add_parser("revoke", help="revoke a key: it stops working at once")
    revoke.add_argument("key_id", help="the key's id (key_..., from 'keys list')")

    worker = sub.add_parser("worker", help="run workers only (any number, on any machine)")
    worker.add_argument("--concurrency", type=int, help="runs at a time in this process")

    db = sub.add_parser("db", help="database maintenance")
    db_sub = db.add_subparsers(dest="action", required=True, metavar="ACTION")
    db_sub.add_parser("migrate", help="apply schema migrations")
    prune = db_sub.add_parser(
        "prune",
        help="keep only the latest checkpoint of idle conversations; delete expired memories;"
        " apply the retention (event logs, spans, ledger, audit) and create partitions ahead",
    )
    prune.add_argument("--days", type=float, help="idle for this long (default: the setting)")
    stop = db_sub.add_parser(
        "stop", help="stop the embedded database (normally the last agentrt process does)"
    )
    stop.add_argument(
        "--force", action="store_true", help="stop it even if agentrt processes still use it"
    )
    analyst = db_sub.add_parser(
        "analyst-role", help="create a read-only role for analysts (the memory views only)"
    )
    analyst.add_argument("--name", default="agentrt_analyst", help="the role's name")
    analyst.add_argument("--password", help="its password (a random one is printed if unset)")
    return parser


def _agents_parser(sub: Any, client: argparse.ArgumentParser) -> None:
    agents = sub.add_parser("agents", help="agent profiles: list, show, create, update, delete")
    agents_sub = agents.add_subparsers(dest="action", required=True, metavar="ACTION")
    agents_sub.add_parser("list", parents=[client], help="the agents, each at its latest version")
    show = agents_sub.add_parser("show", parents=[client], help="one agent's profile as JSON")
    show.add_argument("agent", help="NAME (latest version) or NAME@VERSION")
    versions = agents_sub.add_parser(
        "versions", parents=[client], help="every version, newest first"
    )
    versions.add_argument("name", help="the agent's name")
    create = agents_sub.add_parser(
        "create", parents=[client], help="create an agent from a YAML or JSON file (admins)"
    )
    create.add_argument("file", help="the profile (name, instructions, model, tools, context...)")
    create.add_argument("--name", help="the agent's name (default: `name` in the file)")
    update = agents_sub.add_parser(
        "update", parents=[client], help="store a new version from a file; new runs use it"
    )
    update.add_argument("name", help="the agent's name")
    update.add_argument("file", help="the whole new profile, as YAML or JSON")
    delete = agents_sub.add_parser(
        "delete", parents=[client], help="delete an agent (past runs keep their version)"
    )
    delete.add_argument("name", help="the agent's name")
