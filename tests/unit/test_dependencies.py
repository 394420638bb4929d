"""Every declared runtime dependency is imported by our code; nothing unused is installed."""

from __future__ import annotations

import ast
import re
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("graphs", "nodes", "tools", "skills", "server", "bench", "tests")


def _imported_top_levels() -> set[str]:
    found: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    found.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    found.add(node.module.split(".")[0])
    return found


def test_every_runtime_dependency_is_imported() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    providers = metadata.packages_distributions()
    imported = _imported_top_levels()
    unused = []
    for requirement in project["dependencies"]:
        name = re.split(r"[\[<>=!~ ;]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        modules = {
            m
            for m, dists in providers.items()
            if name in {d.lower().replace("_", "-") for d in dists}
        }
        if not modules & imported:
            unused.append(name)
    assert unused == []
