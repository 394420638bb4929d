"""Run the benchmarks and write their figures to docs/benchmarks.md.

`python -m bench.run [--quick] [--only NAME ...]`; each benchmark starts what it needs
(embedded Postgres, server and worker processes) and stops it afterwards.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

from bench.common import Figures, embedded_postgres, machine

BENCHMARKS = ["workers"]
DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
HEADER = (
    "# Benchmarks\n\nFigures from `make bench` (`make bench-quick` for a short run). "
    "Each section is replaced when its benchmark runs again.\n"
)


def write_section(figures: Figures, stamp: str, quick: bool) -> None:
    """Replace (or add) the figures' section in docs/benchmarks.md."""
    text = DOC.read_text() if DOC.exists() else HEADER
    body = figures.markdown().replace(
        f"## {figures.title}\n",
        f"## {figures.title}\n\n{stamp}{' (quick)' if quick else ''}\n",
    )
    pattern = re.compile(rf"^## {re.escape(figures.title)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda _: body, text) if pattern.search(text) else text + "\n" + body
    DOC.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="*", default=BENCHMARKS, choices=BENCHMARKS)
    args = parser.parse_args(argv)
    stamp = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {machine()}"
    print(stamp, flush=True)
    for name in args.only:
        module = importlib.import_module(f"bench.{name}")
        with embedded_postgres() as url:
            figures = module.main(url, args.quick)
        write_section(figures, stamp, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
