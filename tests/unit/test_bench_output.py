"""`make bench-quick` must not rewrite the tracked docs/benchmarks.md."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench.common import Figures
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
