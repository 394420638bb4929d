"""Durable ingestion: a document row is its own job, claimed with a lease, applied idempotently.

`POST .../documents` stores the document as `queued` and answers at once. Workers claim
documents with `FOR UPDATE SKIP LOCKED` and a lease token, parse and chunk them, and embed and
store the chunks batch by batch: each batch's chunks and the progress are written in one
transaction under the lease. A worker that dies leaves its lease to expire; the next one
keeps the batches already stored (chunk ids are stable) and embeds only the rest, so every
chunk is stored once and paid for once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import socket
from dataclasses import dataclass, field
from typing import Any

from psycopg.types.json import Jsonb

from nodes.embeddings.embedder import EmbeddingScope, embedding_scope
from server.db.pool import Pool
from server.errors import InvalidDocumentError, JobLeaseLostError
from server.ids import new_id
from server.knowledge.cells import maintain_cells
from server.knowledge.chunking import Chunk, chunk_blocks
from server.knowledge.parsing import parse
from server.knowledge.search import Embedders, vector_literal
from server.settings import Settings

log = logging.getLogger(__name__)

_CLAIM = """
UPDATE kb_documents SET status = 'processing', attempts = attempts + 1,
    lease_owner = %(owner)s || ':' || (attempts + 1),
    lease_expires_at = now() + make_interval(secs => %(lease)s), updated_at = now()
WHERE id = (
    SELECT id FROM kb_documents
    WHERE (status = 'queued' AND (lease_expires_at IS NULL OR lease_expires_at <= now()))
       OR (status = 'processing' AND lease_expires_at < now())
    ORDER BY created_at
    FOR UPDATE SKIP LOCKED
    LIMIT 1)
RETURNING id, kb_id, tenant_id, title, source_url, media_type, content, metadata, attempts,
    lease_owner
"""

_STORE = """
INSERT INTO kb_chunks (id, document_id, kb_id, tenant_id, position, heading_path, page, text,
    tokens, label, metadata, dims, embedding)
VALUES (%(id)s, %(doc)s, %(kb)s, %(tenant)s, %(position)s, %(path)s, %(page)s, %(text)s,
    %(tokens)s, %(label)s, %(metadata)s, %(dims)s, %(vec)s::halfvec)
ON CONFLICT (document_id, position) DO NOTHING
"""


def chunk_id(document_id: str, chunk: Chunk) -> str:
    """Return a chunk's id: stable for the same document, position and text."""
    key = f"{document_id}|{chunk.position}|{chunk.text}".encode()
    return f"chk_{hashlib.sha256(key).hexdigest()[:16]}"


def document_chunks(content: bytes, media_type: str, chunking: dict[str, Any]) -> list[Chunk]:
    """Parse and chunk a document with its knowledge base's chunking policy.

    Raises:
        InvalidDocumentError: it cannot be parsed, or it holds no text.
    """
    blocks = parse(content, media_type)
    chunks = chunk_blocks(
        blocks,
        target_tokens=int(chunking.get("targetTokens", 300)),
        overlap_tokens=int(chunking.get("overlapTokens", 40)),
    )
    if not chunks:
        raise InvalidDocumentError("the document holds no text to index")
    return chunks


@dataclass
class KnowledgeJobs:
    """Claims and ingests documents in this process."""

    pool: Pool
    embedders: Embedders
    settings: Settings
    # Train the vector cells of a knowledge base when due (index kind `ivf`).
    cells: bool = False
    owner: str = field(default_factory=lambda: f"{socket.gethostname()}:{new_id('kw')}")
    _task: asyncio.Task[None] | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        """Start claiming documents in the background."""
        self._task = asyncio.create_task(self._loop(), name="knowledge-jobs")

    async def stop(self) -> None:
        """Stop; a document under way is left to its lease (another worker finishes it)."""
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                worked = await self.run_one()
            except Exception:
                log.exception("knowledge jobs: claiming failed; will retry")
                worked = False
            if not worked:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.settings.knowledge_poll_seconds)

    async def run_one(self) -> bool:
        """Claim and ingest one document; return whether there was one."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                _CLAIM, {"owner": self.owner, "lease": self.settings.knowledge_lease_seconds}
            )
            doc = await cur.fetchone()
        if doc is None:
            return False
        renew = asyncio.create_task(self._renew(doc))
        try:
            await self._ingest(doc)
            if self.cells:
                await self._maintain_cells(doc["kb_id"])
        except JobLeaseLostError as exc:
            log.info("document %s: %s", doc["id"], exc)
        except InvalidDocumentError as exc:
            await self._failed(doc, str(exc), final=True)
        except Exception as exc:
            log.exception("document %s: ingestion failed (attempt %d)", doc["id"], doc["attempts"])
            final = doc["attempts"] >= self.settings.knowledge_max_attempts
            await self._failed(doc, f"{type(exc).__name__}: {exc}", final=final)
        finally:
            renew.cancel()
            await asyncio.gather(renew, return_exceptions=True)
        return True

    async def _maintain_cells(self, kb_id: str) -> None:
        try:
            await maintain_cells(self.pool, kb_id)
        except Exception:
            # The document is stored and searchable (untrained chunks are scanned exactly).
            log.exception("knowledge base %s: training its cells failed", kb_id)

    async def _renew(self, doc: dict[str, Any]) -> None:
        while True:
            await asyncio.sleep(self.settings.knowledge_lease_seconds / 3)
            async with self.pool.connection() as conn:
                await conn.execute(
                    "UPDATE kb_documents SET lease_expires_at = now() + make_interval(secs => %s)"
                    " WHERE id = %s AND lease_owner = %s",
                    (self.settings.knowledge_lease_seconds, doc["id"], doc["lease_owner"]),
                )

    async def _failed(self, doc: dict[str, Any], reason: str, *, final: bool) -> None:
        backoff = min(300.0, 2.0 ** doc["attempts"])
        async with self.pool.connection() as conn:
            await conn.execute(
                "UPDATE kb_documents SET status = %s, error = %s, lease_owner = NULL,"
                " lease_expires_at = CASE WHEN %s THEN NULL"
                " ELSE now() + make_interval(secs => %s) END,"
                " finished_at = CASE WHEN %s THEN now() END, updated_at = now()"
                " WHERE id = %s AND lease_owner = %s",
                (
                    "failed" if final else "queued",
                    reason[:2000],
                    final,
                    backoff,
                    final,
                    doc["id"],
                    doc["lease_owner"],
                ),
            )

    async def _ingest(self, doc: dict[str, Any]) -> None:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT embedding_model, dims, chunking FROM knowledge_bases WHERE id = %s",
                (doc["kb_id"],),
            )
            kb = await cur.fetchone()
            cur = await conn.execute(
                "SELECT position FROM kb_chunks WHERE document_id = %s", (doc["id"],)
            )
            stored = {row["position"] for row in await cur.fetchall()}
        if kb is None:
            raise InvalidDocumentError("its knowledge base was deleted")
        chunks = await asyncio.to_thread(
            document_chunks, bytes(doc["content"]), doc["media_type"], kb["chunking"]
        )
        await self._progress(doc, total=len(chunks))
        embedder = self.embedders.get(kb["embedding_model"], kb["dims"])
        missing = [c for c in chunks if c.position not in stored]
        size = self.settings.knowledge_batch_size
        scope = EmbeddingScope(doc["tenant_id"], None, None, "knowledge")
        for start in range(0, len(missing), size):
            batch = missing[start : start + size]
            with embedding_scope(scope):
                vectors = await embedder.aembed_documents([self._embedded(doc, c) for c in batch])
            await self._store(doc, kb["dims"], batch, vectors)
        await self._finish(doc)

    @staticmethod
    def _embedded(doc: dict[str, Any], chunk: Chunk) -> str:
        """The text a chunk is embedded as: its title and headings give it context."""
        return "\n".join([" > ".join([doc["title"], *chunk.heading_path]), chunk.text])

    async def _progress(self, doc: dict[str, Any], *, total: int) -> None:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "UPDATE kb_documents SET chunks_total = %s, updated_at = now()"
                " WHERE id = %s AND lease_owner = %s",
                (total, doc["id"], doc["lease_owner"]),
            )
            if cur.rowcount != 1:
                raise JobLeaseLostError("the document was taken over")

    async def _store(
        self, doc: dict[str, Any], dims: int, batch: list[Chunk], vectors: list[list[float]]
    ) -> None:
        rows = [
            {
                "id": chunk_id(doc["id"], c),
                "doc": doc["id"],
                "kb": doc["kb_id"],
                "tenant": doc["tenant_id"],
                "position": c.position,
                "path": list(c.heading_path),
                "page": c.page,
                "text": c.text,
                "tokens": c.tokens,
                "label": " ".join([doc["title"], *c.heading_path]),
                "metadata": Jsonb(doc["metadata"] or {}),
                "dims": dims,
                "vec": vector_literal(v),
            }
            for c, v in zip(batch, vectors, strict=True)
        ]
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                "SELECT 1 FROM kb_documents WHERE id = %s AND lease_owner = %s FOR UPDATE",
                (doc["id"], doc["lease_owner"]),
            )
            if await cur.fetchone() is None:
                raise JobLeaseLostError("chunks not stored: the document was taken over")
            async with conn.cursor() as write:
                await write.executemany(_STORE, rows)
            await conn.execute(
                "UPDATE kb_documents SET chunks_done = (SELECT count(*) FROM kb_chunks"
                " WHERE document_id = %(id)s), updated_at = now() WHERE id = %(id)s",
                {"id": doc["id"]},
            )

    async def _finish(self, doc: dict[str, Any]) -> None:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "UPDATE kb_documents SET status = 'ready', error = NULL, finished_at = now(),"
                " updated_at = now(), lease_owner = NULL, lease_expires_at = NULL"
                " WHERE id = %s AND lease_owner = %s",
                (doc["id"], doc["lease_owner"]),
            )
            if cur.rowcount != 1:
                raise JobLeaseLostError("not finished: the document was taken over")
