r"""Input guards: text Postgres cannot store, oversized bodies, unbounded metadata.

Postgres `text` and `jsonb` refuse NUL (U+0000) and UTF-8 cannot encode a lone surrogate
(JSON allows both as `\u` escapes). In a request body, both are taken as U+FFFD, as the
runtime stores a NUL in a model's answer or a document; in a path or a query string, a NUL
is refused with a 4xx at the edge.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any
from urllib.parse import unquote_to_bytes

from pydantic import BeforeValidator
from starlette.datastructures import Headers
from starlette.middleware.body_limit import RequestBodyLimitMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from server import jsontext
from server.errors import AgentrtError, InvalidRequestError, NotFoundError, TooLargeError
from server.routes.errors import answer

MAX_METADATA_DEPTH = 8
_INVISIBLE = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp"})


def _unstorable(value: Any) -> bool:
    if isinstance(value, str):
        return jsontext.UNSTORABLE.search(value) is not None
    if isinstance(value, dict):
        return any(_unstorable(k) or _unstorable(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_unstorable(item) for item in value)
    return False


def _storable(value: Any) -> Any:
    # Looked for first: a body without any (nearly all) is passed on as it came.
    return jsontext.storable(value) if _unstorable(value) else value


CleanText = BeforeValidator(_storable)
"""Annotate a body model with this to store NUL characters and lone surrogates as U+FFFD."""


def is_blank(text: str) -> bool:
    """Say whether `text` has nothing visible (whitespace, zero-width and control chars)."""
    return all(ch.isspace() or unicodedata.category(ch) in _INVISIBLE for ch in text)


def json_depth(value: Any) -> int:
    """Return how deeply objects and arrays nest in `value` (a scalar is 0)."""
    if isinstance(value, dict):
        return 1 + max((json_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((json_depth(v) for v in value), default=0)
    return 0


def metadata_problem(metadata: dict[str, Any], max_bytes: int) -> str | None:
    """Say why `metadata` is too big to store, or None when it fits."""
    depth = json_depth(metadata)
    if depth > MAX_METADATA_DEPTH:
        return f"metadata nests {depth} levels deep; the limit is {MAX_METADATA_DEPTH}"
    size = len(json.dumps(metadata, ensure_ascii=False).encode())
    if size > max_bytes:
        return (
            f"metadata is {size} bytes as JSON; the limit is {max_bytes} "
            "(AGENTRT_MAX_METADATA_BYTES)"
        )
    return None


class RequestGuard:
    """Refuse, before the body is read, requests no route could serve.

    A declared Content-Length over the limit gets 413 at once; a body sent without one is
    cut off by Starlette's body limit when it passes the limit while read, and the app's
    HTTPException handler answers that 413. A NUL in the path gets 404, since no id contains
    one; a NUL in the query string gets 422.
    """

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        # Not FastAPI's `max_body_size`: that sits outside user middleware and would answer
        # a declared oversized body in plain text before this guard could answer JSON.
        self.app = RequestBodyLimitMiddleware(app, max_body_bytes)
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Refuse an oversized or unstorable request with a 4xx before the route runs."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await answer(refusal)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> AgentrtError | None:
        length = Headers(scope=scope).get("content-length", "")
        # isdigit() alone takes "²" (Content-Length is Latin-1), which int() refuses.
        if length.isascii() and length.isdigit() and int(length) > self.max_body_bytes:
            return TooLargeError(self.too_large_message(int(length)))
        if "\x00" in scope["path"]:
            return NotFoundError("no such resource: the path contains a NUL character")
        if b"\x00" in unquote_to_bytes(scope.get("query_string", b"")):
            return InvalidRequestError("the query string contains a NUL character (%00)")
        return None

    def too_large_message(self, size: int | None = None) -> str:
        """Explain a refused body and where the limit is set."""
        what = f"the request body is {size} bytes" if size else "the request body is too large"
        return f"{what}; the limit is {self.max_body_bytes} bytes (AGENTRT_MAX_BODY_BYTES)"
