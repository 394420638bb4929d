"""Check a chaos trial from the database and the outside ledger: what must hold for every run."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from graphs.events import TERMINAL_EVENTS
from server.events.snapshot import ITEM_SEPARATOR, output_text


@dataclass
class Verdict:
    """What a trial's runs show: counts of each kind of defect, and the measured gaps."""

    runs: int = 0
    completed: int = 0
    cancelled: int = 0
    duplicate_charges: int = 0
    bad_outputs: int = 0
    log_defects: int = 0
    recoveries: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no run broke a rule."""
        return not self.problems


def rebuild(events: list[dict[str, Any]]) -> str:
    """The output a client rebuilds from the deltas, superseded items left out."""
    texts: dict[str, str] = {}
    superseded: set[str] = set()
    for e in events:
        data = e["data"]
        if e["type"] == "message.item.created":
            texts[data["itemId"]] = ""
        elif e["type"] == "message.item.delta":
            texts[data["itemId"]] += data["delta"]
        elif e["type"] == "message.item.completed" and data.get("status") == "superseded":
            superseded.add(data["itemId"])
    return ITEM_SEPARATOR.join(t for i, t in texts.items() if i not in superseded and t)


def recovery_gaps(events: list[dict[str, Any]]) -> list[float]:
    """Seconds from a dead attempt's last stored event to the next attempt's `run.started`."""
    gaps = []
    last_ts: datetime | None = None
    expired = False
    for e in events:
        if e["type"] == "run.requeued" and e["data"].get("reason") == "lease expired":
            expired = True
            continue
        if e["type"] == "run.started" and expired and last_ts is not None:
            gaps.append((e["ts"] - last_ts).total_seconds())
            expired = False
        last_ts = e["ts"]
    return gaps


def check(database_url: str, ledger: Path, expected: str, cancelled_ids: set[str]) -> Verdict:
    """Check every run of the trial's database against the chaos rules."""
    verdict = Verdict()
    charges: dict[str, set[str]] = defaultdict(set)
    if ledger.exists():
        for line in ledger.read_text().splitlines():
            run_id, key = line.split()
            charges[run_id].add(key)
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        runs = conn.execute(
            "SELECT r.id, r.status, r.last_event_seq, s.seq AS snapshot_seq,"
            " COALESCE(s.snapshot, s.snapshot_text::jsonb) AS snapshot,"
            " m.content AS stored FROM runs r LEFT JOIN messages m ON m.id = r.output_message_id"
            " LEFT JOIN run_snapshots s ON s.run_id = r.id"
        ).fetchall()
        rows = conn.execute(
            "SELECT run_id, seq, type, ts, data FROM run_events ORDER BY run_id, seq"
        ).fetchall()
        # A `usage` event stored as a stub has its call in its ledger row, in the same
        # transaction: a stub without its row is a log defect (docs/decisions/2042).
        # So has a `run.completed` stub its answer's message (docs/decisions/2050), and an
        # answer's item stub the same message (docs/decisions/2052).
        orphans = conn.execute(
            "SELECT e.run_id, e.seq FROM run_events e WHERE e.type = 'usage'"
            " AND e.data ? 'storedIn' AND NOT EXISTS"
            " (SELECT FROM model_calls m WHERE m.id = e.data ->> 'callId')"
            " UNION ALL SELECT e.run_id, e.seq FROM run_events e"
            " WHERE e.type = 'run.completed' AND e.data ? 'storedIn' AND NOT EXISTS"
            " (SELECT FROM messages m WHERE m.id = e.data ->> 'outputMessageId')"
            " UNION ALL SELECT e.run_id, e.seq FROM run_events e"
            " WHERE e.type = 'message.item.completed' AND e.data ? 'storedIn' AND NOT EXISTS"
            " (SELECT FROM messages m WHERE m.id = e.data ->> 'textMessageId')"
        ).fetchall()
    for orphan in orphans:
        verdict.log_defects += 1
        verdict.problems.append(f"{orphan['run_id']}: event {orphan['seq']} lost its stored part")
    events: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        events[row["run_id"]].append(row)
    for run in runs:
        verdict.runs += 1
        log = events[run["id"]]
        _check_log(verdict, run, log)
        verdict.recoveries += recovery_gaps(log)
        if run["id"] in cancelled_ids:
            verdict.cancelled += run["status"] == "cancelled"
            if run["status"] != "cancelled":
                verdict.problems.append(f"{run['id']}: asked to cancel, ended {run['status']}")
            continue
        if run["status"] != "completed":
            verdict.problems.append(f"{run['id']}: ended {run['status']}; {_trace(log)}")
            continue
        verdict.completed += 1
        if len(charges[run["id"]]) != 1:
            verdict.duplicate_charges += 1
            verdict.problems.append(
                f"{run['id']}: charged {len(charges[run['id']])} times; {_trace(log)}"
            )
        outputs = {rebuild(log), output_text(run["snapshot"]), run["stored"]}
        if outputs != {expected}:
            verdict.bad_outputs += 1
            verdict.problems.append(
                f"{run['id']}: output differs: {sorted(map(repr, outputs))}; {_trace(log)}"
            )
    return verdict


def _check_log(verdict: Verdict, run: dict[str, Any], log: list[dict[str, Any]]) -> None:
    seqs = [e["seq"] for e in log]
    terminal = [e["type"] for e in log if e["type"] in TERMINAL_EVENTS]
    if seqs != list(range(1, len(seqs) + 1)) or len(seqs) != run["last_event_seq"]:
        verdict.log_defects += 1
        verdict.problems.append(f"{run['id']}: event log has a gap or a duplicate")
    if len(terminal) != 1 or log[-1]["type"] not in TERMINAL_EVENTS:
        verdict.log_defects += 1
        verdict.problems.append(f"{run['id']}: terminal events {terminal}")
    # An ended run's stored snapshot folds its whole log (the final append stores it).
    if run["snapshot_seq"] != run["last_event_seq"]:
        verdict.log_defects += 1
        verdict.problems.append(
            f"{run['id']}: snapshot stored at {run['snapshot_seq']}, log at {run['last_event_seq']}"
        )


def _trace(log: list[dict[str, Any]]) -> str:
    """The run's log without deltas, short enough to read in a problem report."""
    parts = []
    for e in log:
        if e["type"] == "message.item.delta":
            continue
        data = e["data"]
        detail = data.get("itemId") or data.get("reason") or data.get("attempt") or ""
        status = data.get("status", "")
        parts.append(f"{e['seq']}:{e['type']}({detail}{' ' + status if status else ''})")
    return " ".join(parts)
