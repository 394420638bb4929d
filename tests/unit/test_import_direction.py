"""Imports flow one way: state, context, tools, skills <- nodes <- graphs/agent.py <- server."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "tools": {"server", "nodes", "graphs", "tests"},
    "nodes": {"server", "tests", "graphs.agent"},
    "graphs": {"server", "tests"},
    "server": {"tests"},
}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_no_package_imports_against_the_direction() -> None:
    offences = []
    for package, forbidden in FORBIDDEN.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in imported_modules(path):
                if any(name == f or name.startswith(f + ".") for f in forbidden):
                    offences.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offences == []


def test_graph_state_imports_nothing_of_ours() -> None:
    ours = {"tools", "nodes", "graphs", "server", "skills"}
    names = imported_modules(ROOT / "graphs" / "state.py")
    assert not {n.split(".")[0] for n in names} & ours
