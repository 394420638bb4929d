"""`agentrt runs show`: a run and its subagents drawn as a tree."""

from __future__ import annotations

from typing import Any

import httpx

from server.client.follow import check

MAX_DEPTH = 10
TASK_CHARS = 60


async def load_tree(
    client: httpx.AsyncClient, run: dict[str, Any], depth: int = 0
) -> dict[str, Any]:
    """Return the run with its child runs under `children`, recursively."""
    node = {**run, "children": []}
    if depth >= MAX_DEPTH:
        return node
    found = check(await client.get(f"/api/runs/{run['runId']}/children"))["children"]
    for child in found:
        node["children"].append(await load_tree(client, child, depth + 1))
    return node


def _line(node: dict[str, Any]) -> str:
    agent = node.get("agent") or {}
    parts = [node["runId"], node["status"], f"{agent.get('name')}@{agent.get('version')}"]
    if node.get("toolCallId"):
        parts.insert(0, f"[{node['toolCallId']}]")
    if node.get("current") is False:
        parts.append("(retried)")
    tokens = (node.get("usage") or {}).get("totalTokens")
    if tokens is not None:
        parts.append(f"{tokens} tokens")
    task = node.get("task")
    if task:
        short = task if len(task) <= TASK_CHARS else task[: TASK_CHARS - 1] + "…"
        parts.append(repr(short))
    return "  ".join(parts)


def render_run_tree(root: dict[str, Any]) -> str:
    """Draw a run and its subagents (from `load_tree`) for a terminal."""
    lines = [_line(root)]

    def walk(node: dict[str, Any], prefix: str) -> None:
        children = node["children"]
        for i, child in enumerate(children):
            last = i == len(children) - 1
            lines.append(prefix + ("└─ " if last else "├─ ") + _line(child))
            walk(child, prefix + ("   " if last else "│  "))

    walk(root, "")
    return "\n".join(lines)
