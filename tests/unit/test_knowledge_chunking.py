"""Documents to chunks: parsing each type, structure kept, sizes and overlap, pages."""

from __future__ import annotations

from itertools import pairwise

import pytest

from nodes.context.tokens import EstimateCounter
from server.errors import InvalidDocumentError
from server.knowledge.chunking import chunk_blocks
from server.knowledge.parsing import media_type_of, parse

pytestmark = pytest.mark.timeout(30)
COUNTER = EstimateCounter()


def pdf(*pages: str) -> bytes:
    """A minimal PDF with one line of Helvetica text per page (offsets computed)."""
    objects = ["<< /Type /Catalog /Pages 2 0 R >>"]
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(len(pages)))
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>")
    objects.append("<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, text in enumerate(pages):
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET"
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {5 + 2 * i} 0 R"
            " /Resources << /Font << /F1 3 0 R >> >> >>"
        )
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
    out = b"%PDF-1.4\n"
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += b"".join(f"{o:010d} 00000 n \n".encode() for o in offsets)
    out += (
        f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    )
    return out


def test_markdown_chunks_follow_headings_and_keep_code_blocks_whole() -> None:
    text = """# Guide

Intro paragraph.

## Install

Run the installer.

```
pip install agentrt
agentrt serve
```

## Use

### Tokens

Tokens expire after one hour.
"""
    chunks = chunk_blocks(parse(text.encode(), "text/markdown"), target_tokens=200)
    paths = [c.heading_path for c in chunks]
    assert paths == [("Guide",), ("Guide", "Install"), ("Guide", "Use", "Tokens")]
    assert "pip install agentrt\nagentrt serve" in chunks[1].text
    assert [c.position for c in chunks] == [0, 1, 2]


def test_long_sections_are_cut_near_the_target_with_overlap_between_neighbours() -> None:
    sentences = [f"Sentence number {i} says something about topic {i}." for i in range(60)]
    text = "# Long\n\n" + " ".join(sentences[:30]) + "\n\n" + " ".join(sentences[30:])
    chunks = chunk_blocks(
        parse(text.encode(), "text/markdown"), target_tokens=80, overlap_tokens=15
    )
    assert len(chunks) > 4
    assert all(c.tokens <= 80 + 15 + 5 for c in chunks)
    for before, after in pairwise(chunks):
        tail = before.text.split()[-2:]
        assert " ".join(tail) in after.text  # the next one starts with the previous's end
    joined = " ".join(c.text for c in chunks)
    assert all(s in joined for s in sentences)


def test_html_headings_paragraphs_and_pre_blocks_become_blocks() -> None:
    html = (
        "<html><head><title>x</title><style>p{}</style></head><body><h1>Status</h1>"
        "<p>All systems go.</p><pre>  ping\n  pong</pre><h2>Incidents</h2><ul><li>None"
        "</li></ul><script>var x = 1;</script></body></html>"
    )
    blocks = parse(html.encode(), "text/html")
    assert [(b.kind, b.text) for b in blocks] == [
        ("heading", "Status"),
        ("paragraph", "All systems go."),
        ("code", "  ping\n  pong"),
        ("heading", "Incidents"),
        ("paragraph", "None"),
    ]


def test_pdf_text_is_read_by_pypdf_and_chunks_remember_their_page() -> None:
    blocks = parse(pdf("Refunds take ten days.", "Appeals go to the board."), "application/pdf")
    assert [(b.text, b.page) for b in blocks] == [
        ("Refunds take ten days.", 1),
        ("Appeals go to the board.", 2),
    ]
    chunks = chunk_blocks(blocks, target_tokens=6, overlap_tokens=0)
    assert [c.page for c in chunks] == [1, 2]


def test_a_nul_character_in_a_documents_text_is_replaced() -> None:
    # Postgres text cannot hold one: the document's chunks could not be stored.
    for media_type in ("text/plain", "text/markdown", "text/html"):
        (block,) = parse(b"hello\x00world", media_type)
        assert block.text == "hello\ufffdworld", media_type
    (page,) = parse(pdf("Refunds\\000take ten days."), "application/pdf")
    assert "\x00" not in page.text and page.text.startswith("Refunds"), page.text


def test_unreadable_documents_are_refused_with_a_reason() -> None:
    with pytest.raises(InvalidDocumentError, match="PDF"):
        parse(b"%PDF-1.4 nothing", "application/pdf")
    with pytest.raises(InvalidDocumentError, match="UTF-8"):
        parse(b"\xff\xfe\x00bad", "text/plain")


def test_media_types_come_from_the_declared_type_or_the_file_name() -> None:
    assert media_type_of("notes.MD", None) == "text/markdown"
    assert media_type_of("x.bin", "text/html; charset=utf-8") == "text/html"
    assert media_type_of("report.pdf", "application/octet-stream") == "application/pdf"
    assert media_type_of("tool.exe", "application/octet-stream") is None
