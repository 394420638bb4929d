"""Imports flow one way: graphs/state+context, tools, skills <- nodes <- graphs/agent <- server."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "graphs/state.py": {"nodes", "server", "tools", "skills", "graphs.agent"},
    "graphs/context.py": {"nodes", "server", "tools", "skills", "graphs.agent"},
    "nodes": {"server", "graphs.agent", "tests"},
    "tools": {"server", "nodes", "graphs.agent", "tests"},
    "server": {"tests"},
}


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_module_imports_against_the_direction() -> None:
    bad = []
    for where, forbidden in FORBIDDEN.items():
        target = ROOT / where
        files = [target] if target.suffix == ".py" else sorted(target.rglob("*.py"))
        for file in files:
            for name in imported(file):
                if any(name == f or name.startswith(f + ".") for f in forbidden):
                    bad.append(f"{file.relative_to(ROOT)} imports {name}")
    assert bad == []
