"""The docs stand alone and describe commands and settings that exist."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from server.client.parser import build_parser
from server.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["README.md", "docs", "graphs", "nodes", "tools", "skills", "server", "bench", "tests"]


def _files() -> list[Path]:
    found = []
    for name in SOURCES:
        path = ROOT / name
        found.extend([path] if path.is_file() else [*path.rglob("*.md"), *path.rglob("*.py")])
    return found


def test_nothing_cites_a_document_that_is_not_in_the_repository() -> None:
    cited = [str(p.relative_to(ROOT)) for p in _files() if "SPEC §" in p.read_text()]
    assert cited == [] or cited == ["tests/unit/test_docs.py"]


def test_the_readme_commands_parse() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Commands\n", 1)[1].split("```", 2)[1]
    parser = build_parser()
    placeholders = {"ID": "x", "N": "1", "T": "t", "U": "u"}
    for line in block.strip().splitlines():
        usage = re.sub(r"\[[^\]]*\]", "", line.split("#", 1)[0]).strip()
        variants = usage.split(" | ")
        head = shlex.split(variants[0])
        for variant in variants:
            words = shlex.split(variant)
            if words[0] != "agentrt":  # another action of the same command
                words = [*head[:2], *words]
            parser.parse_args([placeholders.get(w, w) for w in words[1:]])


def test_the_readme_documents_the_settings_a_newcomer_needs() -> None:
    readme = (ROOT / "README.md").read_text()
    for variable in ("PORT", "HOST", "URL", "API_KEY", "TOOL_MODULES"):
        assert f"`AGENTRT_{variable}`" in readme
        assert variable.lower() in Settings.model_fields
    assert "to be merged" not in (ROOT / "docs" / "api-usage.md").read_text()
    assert not re.search(r"agentrt approvals (approve|reject)", readme)
