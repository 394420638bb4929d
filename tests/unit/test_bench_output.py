"""`make bench-quick` must not rewrite the tracked docs/benchmarks.md."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench.answer_length import Cost, per_piece
from bench.common import Figures
from bench.db_cost import parse_records
from bench.run import DOC, output_path, write_section

ROOT = Path(__file__).resolve().parents[2]


def test_quick_runs_write_to_an_ignored_results_folder() -> None:
    path = output_path(quick=True)
    assert path != DOC
    assert path.resolve().is_relative_to(ROOT / "bench" / "results")
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", str(path)], cwd=ROOT, check=False, timeout=30
    )
    assert ignored.returncode == 0, f"{path} is not ignored by git"


def test_only_a_full_run_updates_the_docs() -> None:
    assert output_path(quick=False) == DOC


def test_write_section_replaces_its_section_in_the_given_file(tmp_path: Path) -> None:
    doc = tmp_path / "results" / "quick.md"
    figures = Figures("Start-up", "make bench")
    figures.lines.append("- agentrt --help: 0.2 s")
    write_section(figures, "2026-01-01", quick=True, doc=doc)
    write_section(figures, "2026-01-02", quick=True, doc=doc)
    text = doc.read_text()
    assert text.count("## Start-up") == 1
    assert "2026-01-02 (quick)" in text


def test_the_wal_of_other_databases_is_left_out_of_a_benchmarks_figures() -> None:
    dump = "\n".join(
        [
            "rmgr: Heap        len (rec/tot):     54/    54, tx:        755, lsn: 0/01A0, prev"
            " 0/0198, desc: INSERT off: 3, blkref #0: rel 1663/16384/16401 blk 0",
            "rmgr: XLOG        len (rec/tot):     49/  8249, tx:          0, lsn: 0/01B0, prev"
            " 0/01A0, desc: FPI_FOR_HINT , blkref #0: rel 1663/16999/17001 blk 7 FPW",
            "rmgr: Heap        len (rec/tot):     59/  8239, tx:        756, lsn: 0/21E0, prev"
            " 0/01B0, desc: UPDATE, blkref #0: rel 1664/0/1262 blk 0 FPW",
            "rmgr: Transaction len (rec/tot):     34/    34, tx:        755, lsn: 0/2210, prev"
            " 0/21E0, desc: COMMIT 2026-12-02 05:40:00.000000 UTC",
            "pg_waldump: error: error in WAL record at 0/2240: invalid record length",
        ]
    )
    assert parse_records(dump, "16384") == [
        ("Heap", 54, 54, "16401"),
        ("Heap", 59, 8239, "1262"),  # a shared catalog's
        ("Transaction", 34, 34, None),
    ]


def test_a_pieces_cost_is_the_difference_of_two_lengths_over_the_pieces_added() -> None:
    short = Cost({"API": 5.0, "worker": 20.0}, 8.0)
    long = Cost({"API": 5.5, "worker": 44.0}, 8.96)
    assert per_piece(short, long, added=480) == pytest.approx(
        {"API": 1.04, "worker": 50.0, "Postgres": 2.0}, abs=0.01
    )
