"""Documents to structured blocks: plain text, Markdown, HTML and PDF (through pypdf).

A block is a heading, a paragraph or a code block, with the page it came from for PDFs; the
chunker (chunking.py) groups blocks into chunks without cutting through their structure.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Literal

from server.errors import InvalidDocumentError
from server.jsontext import storable

MEDIA_TYPES = {
    "text/plain": "text",
    "text/markdown": "markdown",
    "text/html": "html",
    "application/pdf": "pdf",
}
SUFFIXES = {
    ".txt": "text/plain",
    ".text": "text/plain",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".html": "text/html",
    ".htm": "text/html",
    ".pdf": "application/pdf",
}
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^(```|~~~)")
_SPACE = re.compile(r"[ \t\r\f\v]+")


@dataclass(frozen=True)
class Block:
    """One structural piece of a document.

    Attributes:
        kind: `heading`, `paragraph` or `code`.
        text: Its text (code keeps its line breaks and indentation).
        level: A heading's level (1 for `#`, `<h1>`); 0 otherwise.
        page: The PDF page it came from (1-based); None for other documents.
    """

    kind: Literal["heading", "paragraph", "code"]
    text: str
    level: int = 0
    page: int | None = None


def media_type_of(name: str | None, declared: str | None) -> str | None:
    """Return the supported media type of an upload from its declared type or file name."""
    if declared:
        base = declared.split(";", 1)[0].strip().lower()
        if base in MEDIA_TYPES:
            return base
    if name:
        lowered = name.lower()
        for suffix, media_type in SUFFIXES.items():
            if lowered.endswith(suffix):
                return media_type
    return None


def parse(content: bytes, media_type: str) -> list[Block]:
    """Return the blocks of a document.

    Raises:
        InvalidDocumentError: not text in UTF-8, or a PDF pypdf cannot read.
    """
    kind = MEDIA_TYPES.get(media_type)
    if kind == "pdf":
        return parse_pdf(content)
    try:
        # A NUL character (Postgres text cannot hold one) is indexed as U+FFFD.
        text: str = storable(content.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise InvalidDocumentError(
            f"the document is not UTF-8 text (byte {exc.start}); convert it to UTF-8"
        ) from exc
    if kind == "markdown":
        return parse_markdown(text)
    if kind == "html":
        return parse_html(text)
    return parse_text(text)


def _paragraphs(text: str, page: int | None = None) -> list[Block]:
    return [
        Block("paragraph", _SPACE.sub(" ", part.replace("\n", " ")).strip(), page=page)
        for part in re.split(r"\n\s*\n", text)
        if part.strip()
    ]


def parse_text(text: str) -> list[Block]:
    """Plain text: paragraphs are separated by blank lines."""
    return _paragraphs(text)


def parse_markdown(text: str) -> list[Block]:
    """Markdown: ATX headings, fenced code blocks, and paragraphs between blank lines."""
    blocks: list[Block] = []
    para: list[str] = []
    code: list[str] | None = None

    def flush() -> None:
        if para:
            blocks.extend(_paragraphs("\n".join(para)))
            para.clear()

    for line in text.splitlines():
        if code is not None:
            if _FENCE.match(line.strip()):
                blocks.append(Block("code", "\n".join(code)))
                code = None
            else:
                code.append(line)
            continue
        if _FENCE.match(line.strip()):
            flush()
            code = []
            continue
        heading = _HEADING.match(line)
        if heading:
            flush()
            blocks.append(Block("heading", heading[2], level=len(heading[1])))
        elif not line.strip():
            flush()
        else:
            para.append(line)
    flush()
    if code:
        blocks.append(Block("code", "\n".join(code)))
    return blocks


class _HtmlBlocks(HTMLParser):
    _BLOCK = frozenset(["p", "li", "td", "th", "div", "blockquote", "dd", "dt", "tr", "br"])
    _SKIP = frozenset(["script", "style", "noscript", "template", "head"])

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[Block] = []
        self._text: list[str] = []
        self._heading = 0
        self._pre = 0
        self._skip = 0

    def _flush(self) -> None:
        text = "".join(self._text)
        self._text.clear()
        if self._pre:
            if text.strip("\n"):
                self.blocks.append(Block("code", text.strip("\n")))
            return
        text = _SPACE.sub(" ", text.replace("\n", " ")).strip()
        if text:
            kind: Literal["heading", "paragraph"] = "heading" if self._heading else "paragraph"
            self.blocks.append(Block(kind, text, level=self._heading))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._SKIP:
            self._skip += 1
        elif re.fullmatch(r"h[1-6]", tag):
            self._flush()
            self._heading = int(tag[1])
        elif tag == "pre":
            self._flush()
            self._pre += 1
        elif tag in self._BLOCK and not self._pre:
            self._flush()

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP:
            self._skip = max(0, self._skip - 1)
        elif re.fullmatch(r"h[1-6]", tag):
            self._flush()
            self._heading = 0
        elif tag == "pre":
            self._flush()
            self._pre = max(0, self._pre - 1)
        elif tag in self._BLOCK and not self._pre:
            self._flush()

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self._text.append(data)


def parse_html(text: str) -> list[Block]:
    """HTML: `<h1>`-`<h6>` headings, `<pre>` code, block elements as paragraphs."""
    parser = _HtmlBlocks()
    parser.feed(text)
    parser.close()
    parser._flush()
    return parser.blocks


def parse_pdf(content: bytes) -> list[Block]:
    """PDF: each page's extracted text, as paragraphs that remember their page."""
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(content))
        pages: list[str] = [storable(page.extract_text() or "") for page in reader.pages]
    except (PdfReadError, ValueError, KeyError, TypeError) as exc:
        raise InvalidDocumentError(f"the PDF cannot be read: {exc}") from exc
    blocks: list[Block] = []
    for number, text in enumerate(pages, start=1):
        # pypdf ends lines at the layout's line breaks; blank lines still part paragraphs.
        blocks.extend(_paragraphs(text, page=number))
    return blocks
