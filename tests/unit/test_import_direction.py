"""Imports flow one way: state/context, tools, skills <- nodes <- graphs.agent <- server."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "tools": {"nodes", "graphs", "server", "tests"},
    "skills": {"nodes", "graphs", "server", "tests"},
    "nodes": {"server", "tests", "graphs.agent"},
    "graphs": {"server", "tests"},
    "server": {"tests"},
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_no_package_imports_against_the_direction() -> None:
    violations = []
    for package, banned in FORBIDDEN.items():
        for path in (ROOT / package).rglob("*.py"):
            for module in imported_modules(path):
                if any(module == b or module.startswith(b + ".") for b in banned):
                    violations.append(f"{path.relative_to(ROOT)} imports {module}")
    assert violations == []


def test_graph_state_imports_nothing_of_ours_and_context_only_leaves() -> None:
    ours = {"graphs", "nodes", "tools", "skills", "server"}
    state = imported_modules(ROOT / "graphs" / "state.py")
    assert not {m.split(".")[0] for m in state} & ours
    context = imported_modules(ROOT / "graphs" / "context.py")
    assert {m.split(".")[0] for m in context} & ours <= {"tools", "skills"}


def test_init_files_are_empty() -> None:
    for package in ("graphs", "nodes", "tools", "skills", "server"):
        for init in (ROOT / package).rglob("__init__.py"):
            assert init.read_text().strip() == "", init
