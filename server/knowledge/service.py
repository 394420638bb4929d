"""Knowledge bases and their documents for people: create, list, add, re-index, delete, search.

Everything is inside the caller's tenant. A knowledge base is shown to those its role list
allows (everyone of the tenant when it names none; admins always); creating, deleting and
changing documents needs the `knowledge-editor` role (admins hold every role).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx
from psycopg.errors import UniqueViolation
from psycopg.types.json import Jsonb

from server.auth import Principal
from server.db.pool import Conn, Pool
from server.errors import (
    DocumentNotFoundError,
    InvalidDocumentError,
    InvalidKnowledgeBaseError,
    KnowledgeBaseExistsError,
    KnowledgeBaseNotFoundError,
    KnowledgeForbiddenError,
    MemoryConfigError,
    UrlNotAllowedError,
)
from server.ids import new_id
from server.knowledge.parsing import MEDIA_TYPES, media_type_of
from server.knowledge.search import PostgresKnowledgeSearch
from server.memory.store import check_embedding_model
from server.settings import Settings
from tools.knowledge.search import KnowledgeQuery, KnowledgeResult

EDITOR = "knowledge-editor"
_KB_COLUMNS = (
    "k.id, k.name, k.description, k.embedding_model, k.dims, k.chunking, k.allowed_profiles,"
    " k.allowed_roles, k.created_by, k.created_at,"
    " (SELECT count(*) FROM kb_documents d WHERE d.kb_id = k.id) AS documents,"
    " (SELECT count(*) FROM kb_chunks c WHERE c.kb_id = k.id) AS chunks"
)
_DOC_COLUMNS = (
    "id, kb_id, title, source_url, media_type, content_hash, metadata, status, error,"
    " chunks_total, chunks_done, attempts, created_by, created_at, updated_at, finished_at,"
    " octet_length(content) AS bytes"
)


def kb_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """Return a knowledge base as the API shows it."""
    return {
        "id": row["id"],
        "name": row["name"],
        "description": row["description"],
        "embeddingModel": row["embedding_model"],
        "dims": row["dims"],
        "chunking": row["chunking"],
        "access": {"profiles": row["allowed_profiles"], "roles": row["allowed_roles"]},
        "documents": row["documents"],
        "chunks": row["chunks"],
        "createdBy": row["created_by"],
        "createdAt": row["created_at"].isoformat(),
    }


def document_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """Return a document and its ingestion progress as the API shows it."""
    return {
        "id": row["id"],
        "knowledgeBaseId": row["kb_id"],
        "title": row["title"],
        "sourceUrl": row["source_url"],
        "mediaType": row["media_type"],
        "bytes": row["bytes"],
        "contentHash": row["content_hash"],
        "metadata": row["metadata"],
        "status": row["status"],
        "error": row["error"],
        "progress": {"chunksDone": row["chunks_done"], "chunksTotal": row["chunks_total"]},
        "attempts": row["attempts"],
        "createdBy": row["created_by"],
        "createdAt": row["created_at"].isoformat(),
        "updatedAt": row["updated_at"].isoformat(),
        "finishedAt": row["finished_at"].isoformat() if row["finished_at"] else None,
    }


class KnowledgeService:
    """The API's and the CLI's view of the knowledge bases, for one caller."""

    def __init__(
        self,
        pool: Pool,
        settings: Settings,
        who: Principal,
        search: PostgresKnowledgeSearch | None = None,
        fetch: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.pool = pool
        self.settings = settings
        self.who = who
        self._search = search
        self._fetch = fetch

    def _editor(self) -> None:
        if not self.who.has_role(EDITOR):
            raise KnowledgeForbiddenError(
                f"changing knowledge bases needs the {EDITOR!r} role (or admin)"
            )

    async def _kb(self, conn: Conn, ref: str) -> dict[str, Any]:
        """Return a knowledge base the caller may see, by id or name."""
        cur = await conn.execute(
            f"SELECT {_KB_COLUMNS} FROM knowledge_bases k WHERE k.tenant_id = %(tenant)s"
            " AND (k.id = %(ref)s OR k.name = %(ref)s) AND (%(admin)s"
            " OR cardinality(k.allowed_roles) = 0 OR k.allowed_roles && %(roles)s::text[])",
            {
                "tenant": self.who.tenant_id,
                "ref": ref,
                "admin": self.who.has_role("admin"),
                "roles": sorted(self.who.roles),
            },
        )
        row = await cur.fetchone()
        if row is None:
            raise KnowledgeBaseNotFoundError(ref)
        return dict(row)

    async def create(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Create a knowledge base (`name`, `embeddingModel`, `chunking`, `access`...)."""
        self._editor()
        model = spec.get("embeddingModel") or self.settings.embedding_model
        try:
            check_embedding_model(self.settings.model_copy(update={"embedding_model": model}))
        except MemoryConfigError as exc:
            raise InvalidKnowledgeBaseError(f"embeddingModel: {exc}") from exc
        chunking = dict(spec.get("chunking") or {})
        access = spec.get("access") or {}
        kb_id = new_id("kb")
        try:
            async with self.pool.connection() as conn:
                await conn.execute(
                    "INSERT INTO knowledge_bases (id, tenant_id, name, description,"
                    " embedding_model, dims, chunking, allowed_profiles, allowed_roles,"
                    " created_by) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    (
                        kb_id,
                        self.who.tenant_id,
                        spec["name"],
                        spec.get("description"),
                        model,
                        self.settings.embedding_dims,
                        Jsonb(chunking),
                        list(access.get("profiles") or []),
                        list(access.get("roles") or []),
                        self.who.user_id,
                    ),
                )
                return kb_view(await self._kb(conn, kb_id))
        except UniqueViolation as exc:
            raise KnowledgeBaseExistsError(spec["name"]) from exc

    async def list_all(self) -> list[dict[str, Any]]:
        """Return the knowledge bases the caller may see, by name."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                f"SELECT {_KB_COLUMNS} FROM knowledge_bases k WHERE k.tenant_id = %(tenant)s"
                " AND (%(admin)s OR cardinality(k.allowed_roles) = 0"
                " OR k.allowed_roles && %(roles)s::text[]) ORDER BY k.name",
                {
                    "tenant": self.who.tenant_id,
                    "admin": self.who.has_role("admin"),
                    "roles": sorted(self.who.roles),
                },
            )
            return [kb_view(row) for row in await cur.fetchall()]

    async def get(self, ref: str) -> dict[str, Any]:
        """Return one knowledge base."""
        async with self.pool.connection() as conn:
            return kb_view(await self._kb(conn, ref))

    async def delete(self, ref: str) -> None:
        """Delete a knowledge base with its documents and chunks."""
        self._editor()
        async with self.pool.connection() as conn:
            kb = await self._kb(conn, ref)
            await conn.execute("DELETE FROM kb_chunks WHERE kb_id = %s", (kb["id"],))
            await conn.execute("DELETE FROM knowledge_bases WHERE id = %s", (kb["id"],))

    async def add_document(
        self,
        ref: str,
        *,
        content: bytes,
        title: str | None,
        file_name: str | None = None,
        media_type: str | None = None,
        source_url: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> tuple[dict[str, Any], bool]:
        """Queue a document for ingestion; return it and whether it was there already.

        The same content added to the same knowledge base again returns the stored document.
        """
        self._editor()
        texts = [title or "", file_name or "", *(metadata or {}).keys(), *(metadata or {}).values()]
        if not all(t.isprintable() for t in texts):
            raise InvalidDocumentError("the title, file name and metadata must be printable text")
        kind = media_type_of(file_name or source_url, media_type)
        if kind is None:
            raise InvalidDocumentError(
                f"unsupported document type {media_type or file_name!r}: send "
                f"{', '.join(MEDIA_TYPES)} (or a .txt, .md, .html or .pdf file name)"
            )
        if not content:
            raise InvalidDocumentError("the document is empty")
        if len(content) > self.settings.knowledge_max_document_bytes:
            raise InvalidDocumentError(
                f"the document has {len(content)} bytes; the limit is "
                f"{self.settings.knowledge_max_document_bytes} bytes "
                "(AGENTRT_KNOWLEDGE_MAX_DOCUMENT_BYTES)"
            )
        digest = hashlib.sha256(content).hexdigest()
        async with self.pool.connection() as conn:
            kb = await self._kb(conn, ref)
            cur = await conn.execute(
                "INSERT INTO kb_documents (id, kb_id, tenant_id, title, source_url, media_type,"
                " content, content_hash, metadata, created_by) VALUES (%s, %s, %s, %s, %s, %s,"
                " %s, %s, %s, %s) ON CONFLICT (kb_id, content_hash) DO NOTHING RETURNING id",
                (
                    new_id("doc"),
                    kb["id"],
                    self.who.tenant_id,
                    title or file_name or source_url or "untitled",
                    source_url,
                    kind,
                    content,
                    digest,
                    Jsonb(dict(metadata or {})),
                    self.who.user_id,
                ),
            )
            inserted = await cur.fetchone()
            cur = await conn.execute(
                f"SELECT {_DOC_COLUMNS} FROM kb_documents WHERE kb_id = %s AND content_hash = %s",
                (kb["id"], digest),
            )
            row = await cur.fetchone()
        assert row is not None
        return document_view(row), inserted is None

    async def add_url(
        self, ref: str, url: str, *, title: str | None, metadata: Mapping[str, str] | None
    ) -> tuple[dict[str, Any], bool]:
        """Fetch a document from an allow-listed host and queue it."""
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        allowed = [h.lower() for h in self.settings.knowledge_url_allowlist]
        if parts.scheme not in ("http", "https") or not any(
            host == h or host.endswith(f".{h}") for h in allowed
        ):
            raise UrlNotAllowedError(
                f"{url!r}: documents are fetched only over http(s) from the hosts in "
                f"AGENTRT_KNOWLEDGE_URL_ALLOWLIST ({', '.join(allowed) or 'none set'})"
            )
        self._editor()
        await self._kb_exists(ref)
        limit = self.settings.knowledge_max_document_bytes
        try:
            # Redirects are not followed: they could lead off the allow-list.
            async with httpx.AsyncClient(timeout=30, transport=self._fetch) as client:
                response = await client.get(url)
        except httpx.HTTPError as exc:
            raise InvalidDocumentError(f"{url!r} could not be fetched: {exc}") from exc
        if response.status_code != 200:
            raise InvalidDocumentError(f"{url!r} answered HTTP {response.status_code}, not 200")
        if len(response.content) > limit:
            raise InvalidDocumentError(f"{url!r} is over the {limit}-byte document limit")
        return await self.add_document(
            ref,
            content=response.content,
            title=title,
            file_name=parts.path,
            media_type=response.headers.get("content-type"),
            source_url=url,
            metadata=metadata,
        )

    async def _kb_exists(self, ref: str) -> dict[str, Any]:
        async with self.pool.connection() as conn:
            return await self._kb(conn, ref)

    async def documents(self, ref: str) -> list[dict[str, Any]]:
        """Return a knowledge base's documents, oldest first."""
        async with self.pool.connection() as conn:
            kb = await self._kb(conn, ref)
            cur = await conn.execute(
                f"SELECT {_DOC_COLUMNS} FROM kb_documents WHERE kb_id = %s ORDER BY created_at, id",
                (kb["id"],),
            )
            return [document_view(row) for row in await cur.fetchall()]

    async def document(self, ref: str, document_id: str) -> dict[str, Any]:
        """Return one document with its progress."""
        async with self.pool.connection() as conn:
            kb = await self._kb(conn, ref)
            return document_view(await self._document(conn, kb["id"], document_id))

    @staticmethod
    async def _document(conn: Conn, kb_id: str, document_id: str) -> dict[str, Any]:
        cur = await conn.execute(
            f"SELECT {_DOC_COLUMNS} FROM kb_documents WHERE kb_id = %s AND id = %s",
            (kb_id, document_id),
        )
        row = await cur.fetchone()
        if row is None:
            raise DocumentNotFoundError(document_id)
        return dict(row)

    async def reindex(self, ref: str, document_id: str) -> dict[str, Any]:
        """Drop a document's chunks and queue it again (after a chunking or model change)."""
        self._editor()
        async with self.pool.connection() as conn, conn.transaction():
            kb = await self._kb(conn, ref)
            await self._document(conn, kb["id"], document_id)
            await conn.execute("DELETE FROM kb_chunks WHERE document_id = %s", (document_id,))
            await conn.execute(
                "UPDATE kb_documents SET status = 'queued', error = NULL, chunks_done = 0,"
                " chunks_total = NULL, attempts = 0, lease_owner = NULL,"
                " lease_expires_at = NULL, finished_at = NULL, updated_at = now()"
                " WHERE id = %s",
                (document_id,),
            )
            return document_view(await self._document(conn, kb["id"], document_id))

    async def delete_document(self, ref: str, document_id: str) -> None:
        """Delete a document and its chunks."""
        self._editor()
        async with self.pool.connection() as conn:
            kb = await self._kb(conn, ref)
            await self._document(conn, kb["id"], document_id)
            await conn.execute("DELETE FROM kb_documents WHERE id = %s", (document_id,))

    async def search(
        self, ref: str, text: str, top_k: int, filters: Mapping[str, str] | None = None
    ) -> KnowledgeResult:
        """Search one knowledge base the caller may see (hybrid, as the agents do)."""
        kb = await self._kb_exists(ref)
        if self._search is None:
            raise InvalidKnowledgeBaseError("this server has no knowledge search configured")
        roles = frozenset(self.who.roles)
        return await self._search.search(
            KnowledgeQuery(
                text=text,
                tenant_id=self.who.tenant_id,
                roles=roles | {"admin"} if self.who.has_role("admin") else roles,
                knowledge_bases=[kb["name"]],
                top_k=top_k,
                filters=dict(filters or {}),
            )
        )
