"""Usage of a run tree: a run's own totals plus those of every run below it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nodes.models.usage import Budget, RunTotals
from server.db.pool import Conn, Pool
from server.domain import Run

_SUBTREE = """
WITH RECURSIVE tree AS (
    SELECT id, usage FROM runs WHERE id = %s
    UNION ALL
    SELECT r.id, r.usage FROM runs r JOIN tree t ON r.parent_run_id = t.id
)
SELECT id, usage FROM tree
"""


def add_totals(left: RunTotals, right: RunTotals) -> RunTotals:
    """Return the sum of two runs' totals."""
    return RunTotals(
        input_tokens=left.input_tokens + right.input_tokens,
        output_tokens=left.output_tokens + right.output_tokens,
        cached_input_tokens=left.cached_input_tokens + right.cached_input_tokens,
        reasoning_tokens=left.reasoning_tokens + right.reasoning_tokens,
        known_cost=left.known_cost + right.known_cost,
        unpriced_calls=left.unpriced_calls + right.unpriced_calls,
        model_calls=left.model_calls + right.model_calls,
        failed_model_calls=left.failed_model_calls + right.failed_model_calls,
        tool_calls=left.tool_calls + right.tool_calls,
    )


async def subtree(conn: Conn, run_id: str) -> list[dict[str, Any]]:
    """Return the run and all its descendants (subagents at any depth): `id` and `usage`."""
    cur = await conn.execute(_SUBTREE, (run_id,))
    return list(await cur.fetchall())


async def tree_usage(conn: Conn, run_id: str) -> tuple[RunTotals, int]:
    """Return the totals of the run and all its descendants, and how many runs that is."""
    rows = await subtree(conn, run_id)
    total = RunTotals()
    for row in rows:
        total = add_totals(total, RunTotals.from_json(row["usage"]))
    return total, len(rows)


async def usage_with_descendants(conn: Conn, run_id: str) -> dict[str, Any]:
    """Return the API's view of a run tree's totals (`runs` counts the run itself)."""
    total, runs = await tree_usage(conn, run_id)
    return {**total.to_json(), "runs": runs}


def _less(limit: Any, used: Any) -> Any:
    return None if limit is None else limit - used


async def lowered_by_children(
    pool: Pool, run: Run, snapshot: Mapping[str, Any], budget: Budget
) -> Budget:
    """Return the run's budget less what its child runs spent: children count toward it.

    `snapshot` is the run's, up to date: whether it has children.
    """
    if not snapshot.get("children"):
        return budget
    async with pool.connection() as conn:
        tree, _ = await tree_usage(conn, run.id)
    own = RunTotals.from_json(run.usage)
    return Budget(
        max_tokens=_less(budget.max_tokens, tree.total_tokens - own.total_tokens),
        max_cost=_less(budget.max_cost, tree.known_cost - own.known_cost),
        max_model_calls=_less(budget.max_model_calls, tree.model_calls - own.model_calls),
    )
