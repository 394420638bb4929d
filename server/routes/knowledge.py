"""Knowledge bases, their documents and search; a run's evidence (docs/knowledge.md)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Body, File, Form, Path, Response, UploadFile, status
from pydantic import Field

from server.deps import KnowledgeDep, PoolDep, PrincipalDep
from server.errors import InvalidDocumentError
from server.knowledge.evidence import run_evidence
from server.routes.guards import CleanText
from server.routes.schemas import BODY_ERRORS, COMMON_ERRORS, ApiModel, errors
from server.runs.records import get_run
from tools.jsontypes import JsonInt

router = APIRouter(prefix="/api/knowledge-bases", tags=["knowledge"], responses=COMMON_ERRORS)
evidence_router = APIRouter(prefix="/api/runs", tags=["runs"], responses=COMMON_ERRORS)
NAME = r"^[a-z0-9][a-z0-9_-]{0,62}$"
KbRef = Annotated[
    str, Path(pattern=r"^[A-Za-z0-9_-]{1,80}$", description="The id (`kb_...`) or the name.")
]
DocId = Annotated[str, Path(pattern=r"^doc_[0-9a-f]{1,64}$", description="`doc_...`")]
Metadata = dict[str, Annotated[str, Field(max_length=500)]]


class Chunking(ApiModel):
    """How documents are cut: a target size in tokens, and the overlap between chunks."""

    target_tokens: JsonInt = Field(default=300, ge=50, le=4_000)
    overlap_tokens: JsonInt = Field(default=40, ge=0, le=1_000)


class Access(ApiModel):
    """Who may search: profiles (agent names) and roles; empty lists allow everyone."""

    profiles: list[Annotated[str, Field(pattern=NAME)]] = Field(default_factory=list)
    roles: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(default_factory=list)


class KnowledgeBaseIn(ApiModel):
    """Body of `POST /api/knowledge-bases`."""

    name: str = Field(pattern=NAME)
    description: str | None = Field(default=None, max_length=2_000)
    embedding_model: str | None = Field(
        default=None,
        max_length=200,
        description="`provider:model`; the server's AGENTRT_EMBEDDING_MODEL when unset.",
    )
    chunking: Chunking = Field(default_factory=Chunking)
    access: Access = Field(default_factory=Access)


class UrlDocumentIn(ApiModel):
    """Body of `POST .../documents/from-url`: a document fetched from an allow-listed host."""

    url: str = Field(min_length=8, max_length=2_000)
    title: str | None = Field(default=None, max_length=500)
    metadata: Metadata = Field(default_factory=dict)


class SearchIn(ApiModel):
    """Body of `POST .../search`."""

    query: str = Field(min_length=1, max_length=4_000)
    top_k: JsonInt = Field(default=5, ge=1, le=50)
    filters: Metadata = Field(
        default_factory=dict, description="Metadata the documents must have (each key equal)."
    )


class KnowledgeBaseOut(ApiModel):
    """A knowledge base."""

    id: str
    name: str
    description: str | None
    embedding_model: str
    dims: int
    chunking: dict[str, Any]
    access: dict[str, Any]
    documents: int
    chunks: int
    created_by: str | None
    created_at: str


class KnowledgeBaseList(ApiModel):
    """The knowledge bases the caller may see."""

    knowledge_bases: list[KnowledgeBaseOut]


class DocumentOut(ApiModel):
    """A document and its ingestion (`status`: queued, processing, ready, failed)."""

    id: str
    knowledge_base_id: str
    title: str
    status: str
    error: str | None
    progress: dict[str, Any]
    duplicate: bool = False


class DocumentList(ApiModel):
    """A knowledge base's documents."""

    documents: list[DocumentOut]


class SearchOut(ApiModel):
    """Search results with their citations."""

    results: list[dict[str, Any]]


class EvidenceOut(ApiModel):
    """A run's retrieval records and its answer's citations resolved to chunks."""

    run_id: str
    retrievals: list[dict[str, Any]]
    citations: list[dict[str, Any]]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=KnowledgeBaseOut,
    responses={**BODY_ERRORS, **errors(403, 409)},
)
async def create_knowledge_base(
    knowledge: KnowledgeDep, body: Annotated[KnowledgeBaseIn, CleanText, Body()]
) -> dict[str, Any]:
    """Create a knowledge base (needs the `knowledge-editor` role)."""
    return await knowledge.create(body.model_dump(by_alias=True))


@router.get("", response_model=KnowledgeBaseList)
async def list_knowledge_bases(knowledge: KnowledgeDep) -> dict[str, Any]:
    """List the knowledge bases of your tenant that your roles may see."""
    return {"knowledgeBases": await knowledge.list_all()}


@router.get("/{kb}", response_model=KnowledgeBaseOut, responses=errors(404))
async def get_knowledge_base(knowledge: KnowledgeDep, kb: KbRef) -> dict[str, Any]:
    """Read one knowledge base."""
    return await knowledge.get(kb)


@router.delete("/{kb}", status_code=status.HTTP_204_NO_CONTENT, responses=errors(403, 404))
async def delete_knowledge_base(knowledge: KnowledgeDep, kb: KbRef) -> Response:
    """Delete a knowledge base with all its documents."""
    await knowledge.delete(kb)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    "/{kb}/documents",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=DocumentOut,
    responses={**BODY_ERRORS, **errors(403, 404)},
)
async def upload_document(
    knowledge: KnowledgeDep,
    kb: KbRef,
    response: Response,
    file: Annotated[UploadFile, File(description="text, Markdown, HTML or PDF")],
    title: Annotated[str | None, Form(max_length=500)] = None,
    metadata: Annotated[str | None, Form(max_length=16_000, description="JSON object")] = None,
) -> dict[str, Any]:
    """Upload a document; it is ingested in the background (200 when already there)."""
    try:
        meta = json.loads(metadata) if metadata else {}
    except ValueError as exc:
        raise InvalidDocumentError(f"metadata is not JSON: {exc}") from exc
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise InvalidDocumentError('metadata must be a JSON object of strings: {"team": "x"}')
    document, duplicate = await knowledge.add_document(
        kb,
        content=await file.read(),
        title=title,
        file_name=file.filename,
        media_type=file.content_type,
        metadata=meta,
    )
    if duplicate:
        response.status_code = status.HTTP_200_OK
    return {**document, "duplicate": duplicate}


@router.post(
    "/{kb}/documents/from-url",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=DocumentOut,
    responses={**BODY_ERRORS, **errors(403, 404)},
)
async def add_document_from_url(
    knowledge: KnowledgeDep,
    kb: KbRef,
    response: Response,
    body: Annotated[UrlDocumentIn, CleanText, Body()],
) -> dict[str, Any]:
    """Fetch a document from an allow-listed host and ingest it in the background."""
    document, duplicate = await knowledge.add_url(
        kb, body.url, title=body.title, metadata=body.metadata
    )
    if duplicate:
        response.status_code = status.HTTP_200_OK
    return {**document, "duplicate": duplicate}


@router.get("/{kb}/documents", response_model=DocumentList, responses=errors(404))
async def list_documents(knowledge: KnowledgeDep, kb: KbRef) -> dict[str, Any]:
    """List a knowledge base's documents with their ingestion status."""
    return {"documents": await knowledge.documents(kb)}


@router.get("/{kb}/documents/{document_id}", response_model=DocumentOut, responses=errors(404))
async def get_document(knowledge: KnowledgeDep, kb: KbRef, document_id: DocId) -> dict[str, Any]:
    """Read one document and its ingestion progress."""
    return await knowledge.document(kb, document_id)


@router.post(
    "/{kb}/documents/{document_id}/reindex",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=DocumentOut,
    responses=errors(403, 404),
)
async def reindex_document(
    knowledge: KnowledgeDep, kb: KbRef, document_id: DocId
) -> dict[str, Any]:
    """Drop a document's chunks and ingest it again."""
    return await knowledge.reindex(kb, document_id)


@router.delete(
    "/{kb}/documents/{document_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=errors(403, 404),
)
async def delete_document(knowledge: KnowledgeDep, kb: KbRef, document_id: DocId) -> Response:
    """Delete a document and its chunks."""
    await knowledge.delete_document(kb, document_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/{kb}/search", response_model=SearchOut, responses={**BODY_ERRORS, **errors(404)})
async def search_knowledge_base(
    knowledge: KnowledgeDep, kb: KbRef, body: Annotated[SearchIn, CleanText, Body()]
) -> dict[str, Any]:
    """Search a knowledge base the way agents do (hybrid: vectors and full text)."""
    result = await knowledge.search(kb, body.query, body.top_k, body.filters)
    return {"results": [{**h.citation(), **h.evidence(), "text": h.text} for h in result.hits]}


@evidence_router.get("/{run_id}/evidence", response_model=EvidenceOut, responses=errors(404))
async def get_run_evidence(run_id: str, pool: PoolDep, who: PrincipalDep) -> dict[str, Any]:
    """Return what the run retrieved, for which model call, and what its answer cites."""
    async with pool.connection() as conn:
        run = await get_run(conn, who, run_id)
        return await run_evidence(conn, run)
