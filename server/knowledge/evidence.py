"""A run's evidence: its retrieval records, and the answer's citations resolved to chunks.

Records are the `retrievals` rows the `retrieval.completed` events filled. For an automatic
retrieval, `inContext` is what the `knowledge` section of that model call's manifest kept
(the section can be cut to fit after the retrieval); citations are the `[chk_...]` markers
of the run's answer, each resolved to the chunk and the retrievals that returned it.
"""

from __future__ import annotations

import re
from typing import Any

from server.db.pool import Conn
from server.domain import Run
from server.events import manifests

MARKER = re.compile(r"\[(chk_[0-9a-f]{16})\]")


async def _kept_by_manifest(conn: Conn, run_id: str) -> dict[int, list[str]]:
    """Chunk ids the `knowledge` section kept, by step (the latest attempt of each step)."""
    cur = await conn.execute(
        f"SELECT DISTINCT ON (step) step, {manifests.stored()} -> 'sections' AS sections"
        " FROM context_manifests WHERE run_id = %s ORDER BY step, attempt DESC, event_seq DESC",
        (run_id,),
    )
    kept: dict[int, list[str]] = {}
    for row in await cur.fetchall():
        for section in row["sections"] or []:
            if section.get("name") == "knowledge":
                kept[row["step"]] = [d.get("chunkId") for d in section.get("itemDetails", [])]
    return kept


async def run_evidence(conn: Conn, run: Run) -> dict[str, Any]:
    """Return the run's retrieval records and its answer's resolved citations."""
    cur = await conn.execute(
        "SELECT id, event_seq, record, created_at FROM retrievals WHERE run_id = %s"
        " ORDER BY event_seq",
        (run.id,),
    )
    rows = await cur.fetchall()
    kept = await _kept_by_manifest(conn, run.id)
    records = []
    returned_by: dict[str, list[str]] = {}
    for stored in rows:
        record = dict(stored["record"])
        step = record.get("step")
        if record.get("mode") == "auto" and isinstance(step, int):
            record["inContext"] = kept.get(step, [])
        else:
            record["inContext"] = list(record.get("used") or [])
        for chunk in record.get("chunks") or []:
            returned_by.setdefault(chunk["chunkId"], []).append(stored["id"])
        records.append(
            {
                **record,
                "eventId": stored["event_seq"],
                "createdAt": stored["created_at"].isoformat(),
            }
        )
    answer = ""
    if run.output_message_id:
        cur = await conn.execute(
            "SELECT content FROM messages WHERE id = %s", (run.output_message_id,)
        )
        message = await cur.fetchone()
        answer = str(message["content"] or "") if message else ""
    cited = list(dict.fromkeys(MARKER.findall(answer)))
    chunks: dict[str, dict[str, Any]] = {}
    if cited:
        cur = await conn.execute(
            "SELECT c.id, c.position, c.heading_path, c.page, c.text, c.document_id,"
            " d.title, d.source_url, k.name AS kb FROM kb_chunks c"
            " JOIN kb_documents d ON d.id = c.document_id"
            " JOIN knowledge_bases k ON k.id = c.kb_id"
            " WHERE c.id = ANY(%s) AND c.tenant_id = %s",
            (cited, run.tenant_id),
        )
        chunks = {found["id"]: dict(found) for found in await cur.fetchall()}
    citations = []
    for chunk_id in cited:
        row = chunks.get(chunk_id)
        citations.append(
            {
                "marker": f"[{chunk_id}]",
                "chunkId": chunk_id,
                # A marker no retrieval of this run returned is not evidence, whatever it names.
                "resolved": chunk_id in returned_by and row is not None,
                "retrievals": returned_by.get(chunk_id, []),
                "knowledgeBase": row["kb"] if row else None,
                "documentId": row["document_id"] if row else None,
                "title": row["title"] if row else None,
                "position": row["position"] if row else None,
                "headingPath": list(row["heading_path"]) if row else [],
                "page": row["page"] if row else None,
                "url": row["source_url"] if row else None,
                "text": row["text"] if row else None,
            }
        )
    return {"runId": run.id, "retrievals": records, "citations": citations}
