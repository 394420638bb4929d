"""Run the benchmarks and write their figures to docs/benchmarks.md.

`python -m bench.run [--quick] [--only NAME ...]`; each benchmark starts what it needs
(embedded Postgres, server and worker processes) and stops it afterwards. Only a full run
updates the tracked docs/benchmarks.md; a quick run writes to bench/results/ (ignored by git),
so figures from whatever machine runs it never land in the docs by accident.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.common import Figures, database_url_for, embedded_postgres, machine

BENCHMARKS = [
    "workers",
    "overhead",
    "floor",
    "durability",
    "first_event",
    "answer_length",
    "conversation_length",
    "long_run",
    "fanout",
    "idle",
    "db_cost",
    "startup",
    "context",
    "memory",
    "skills",
    "subagents",
    "artifacts",
    "lifecycle",
    "knowledge",
    "console",
    "claim",
    "pool_check",
]
# Run only when named (`make bench-large`): they take long and need much disk.
LARGE = ["knowledge_large", "event_log_size"]
FINDINGS = "## Findings and changes\n"
DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
QUICK_DOC = Path(__file__).resolve().parent / "results" / "benchmarks-quick.md"
HEADER = (
    "# Benchmarks\n\nFigures from `make bench` (`make bench-quick` for a short run). "
    "Each section is replaced when its benchmark runs again.\n"
)


def output_path(quick: bool) -> Path:
    """Where a run's figures go: the tracked docs for a full run, bench/results/ otherwise."""
    return QUICK_DOC if quick else DOC


def write_section(figures: Figures, stamp: str, quick: bool, doc: Path | None = None) -> None:
    """Replace (or add) the figures' section in `doc` (by default `output_path(quick)`)."""
    doc = doc or output_path(quick)
    doc.parent.mkdir(parents=True, exist_ok=True)
    text = doc.read_text() if doc.exists() else HEADER
    body = figures.markdown().replace(
        f"## {figures.title}\n",
        f"## {figures.title}\n\n{stamp}{' (quick)' if quick else ''}\n",
    )
    pattern = re.compile(rf"^## {re.escape(figures.title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: body, text)
    elif FINDINGS in text:  # the hand-written findings stay last
        text = text.replace(FINDINGS, body + "\n" + FINDINGS, 1)
    else:
        text = text + "\n" + body
    doc.write_text(text)


def main(argv: list[str] | None = None) -> int:
    """Run the selected benchmarks and write their figures; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="*", default=BENCHMARKS, choices=BENCHMARKS + LARGE)
    args = parser.parse_args(argv)
    stamp = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {machine()}"
    print(stamp, flush=True)
    started = time.monotonic()
    # One Postgres server for the whole run, a fresh database for each benchmark.
    with embedded_postgres() as server_url:
        for name in args.only:
            began = time.monotonic()
            print(f"\n== {name}", flush=True)
            module = importlib.import_module(f"bench.{name}")
            figures = module.main(database_url_for(server_url, f"bench_{name}"), args.quick)
            write_section(figures, stamp, args.quick)
            print(f"({name}: {time.monotonic() - began:.0f} s)", flush=True)
    print(f"\nall benchmarks: {time.monotonic() - started:.0f} s", flush=True)
    print(f"figures written to {output_path(args.quick)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
