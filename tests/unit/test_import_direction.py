"""Imports flow one way: state/context, tools, skills <- nodes <- graphs.agent <- server.

Inside server/: routes -> (runs, events, usage, observability) -> db -> domain, with app.py,
process.py and the command line wiring it all together above the routes.
"""

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
# The vocabulary every layer shares: the event types and payloads, the approval contract.
SHARED_LEAVES = {"graphs.events", "graphs.approval"}

# What wires the server together; the layers below never import it.
WIRING = {
    "server.app",
    "server.process",
    "server.serving",
    "server.startup",
    "server.cli",
    "server.client",
}
# The inner layers of server/: for each, the server modules it may not import.
SERVER_FORBIDDEN = {
    "server.runs": {"server.routes", *WIRING},
    "server.events": {"server.runs", "server.usage", "server.routes", *WIRING},
    "server.usage": {"server.routes", *WIRING},
    "server.observability": {"server.routes", *WIRING},
}
# The lowest layers: the only server modules each may import (besides its own package).
SERVER_ALLOWED = {
    "server.errors": set[str](),
    "server.domain": {"server.errors"},
    "server.jsontext": set[str](),
    "server.db": {
        "server.domain",
        "server.errors",
        "server.settings",
        "server.ids",
        "server.jsontext",
    },
    # The API's rendering of records is pure: it reads typed values, never the database.
    "server.runs.views": {"server.domain", "server.timestamps"},
}
# Imports that break a rule today and need more than a move to fix.
KNOWN_EXCEPTIONS: set[tuple[str, str]] = set()


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            if node.module == "server":  # `from server import app` imports server.app
                found.update(f"server.{alias.name}" for alias in node.names)
    return found


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def files_of(package: str) -> list[Path]:
    base = ROOT / package.replace(".", "/")
    return sorted(base.rglob("*.py")) if base.is_dir() else [base.with_suffix(".py")]


def test_no_package_imports_against_the_direction() -> None:
    violations = []
    for package, banned in FORBIDDEN.items():
        for path in (ROOT / package).rglob("*.py"):
            for module in imported_modules(path):
                if module in SHARED_LEAVES:
                    continue
                if any(module == b or module.startswith(b + ".") for b in banned):
                    violations.append(f"{path.relative_to(ROOT)} imports {module}")
    assert violations == []


def test_server_layers_import_only_downwards() -> None:
    violations = []
    for package, banned in SERVER_FORBIDDEN.items():
        for path in files_of(package):
            for module in imported_modules(path):
                if any(within(module, b) for b in banned):
                    violations.append((path.relative_to(ROOT).as_posix(), module))
    for package, allowed in SERVER_ALLOWED.items():
        for path in files_of(package):
            for module in imported_modules(path):
                if (
                    within(module, "server")
                    and not within(module, package)
                    and not any(within(module, a) for a in allowed)
                    and module != "server"
                ):
                    violations.append((path.relative_to(ROOT).as_posix(), module))
    assert sorted(set(violations) - KNOWN_EXCEPTIONS) == []


def test_known_exceptions_still_exist() -> None:
    for path, module in KNOWN_EXCEPTIONS:
        assert module in imported_modules(ROOT / path), f"{path} no longer imports {module}"


def test_only_the_app_imports_the_routes() -> None:
    importers = set()
    for path in (ROOT / "server").rglob("*.py"):
        if within(".".join(path.relative_to(ROOT).with_suffix("").parts), "server.routes"):
            continue
        if any(within(module, "server.routes") for module in imported_modules(path)):
            importers.add(path.relative_to(ROOT).as_posix())
    assert importers <= {"server/app.py"}


def test_graph_state_imports_nothing_of_ours_and_context_only_leaves() -> None:
    ours = {"graphs", "nodes", "tools", "skills", "server"}
    state = imported_modules(ROOT / "graphs" / "state.py")
    assert not {m.split(".")[0] for m in state} & ours
    for leaf in SHARED_LEAVES:
        imported = imported_modules(ROOT / (leaf.replace(".", "/") + ".py"))
        assert not {m.split(".")[0] for m in imported} & ours, leaf
    context = imported_modules(ROOT / "graphs" / "context.py")
    assert {m.split(".")[0] for m in context} & ours <= {"tools", "skills"}


def test_the_error_taxonomy_imports_only_the_standard_library() -> None:
    # Every layer and the fast-starting `agentrt` command import it.
    imported = {m.split(".")[0] for m in imported_modules(ROOT / "server" / "errors.py")}
    assert imported <= {"__future__", "typing"}


def test_init_files_are_empty() -> None:
    for package in ("graphs", "nodes", "tools", "skills", "server"):
        for init in (ROOT / package).rglob("__init__.py"):
            assert init.read_text().strip() == "", init


# What a route module may not import: it asks a function of runs/, events/ or usage/ instead.
ROUTE_BANNED = {
    "psycopg",
    "server.observability.metrics",
    "server.observability.tracing",
    "server.runs.executor",
}
# Support modules of the routes; every other module of server/routes/ is a router.
ROUTE_SUPPORT = {"server.routes.schemas", "server.routes.guards", "server.routes.errors"}


def test_routes_are_thin() -> None:
    problems = []
    for path in sorted((ROOT / "server" / "routes").glob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if ".".join(path.relative_to(ROOT).with_suffix("").parts) in ROUTE_SUPPORT:
            continue
        text = path.read_text(encoding="utf-8")
        if "app.state" in text:
            problems.append(f"{name} reads app.state (declare a dependency of server/deps.py)")
        if ".execute(" in text:
            problems.append(f"{name} runs SQL")
        for module in imported_modules(path):
            if any(within(module, banned) for banned in ROUTE_BANNED):
                problems.append(f"{name} imports {module}")
            if within(module, "server.routes") and module not in ROUTE_SUPPORT | {"server.routes"}:
                problems.append(f"{name} imports the router {module}")
    assert problems == []
