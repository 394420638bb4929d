"""The workers benchmark's verdicts follow its figures: floor beside agentrt, calls beside CPU."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from bench.callcount import CALLS_DIR_ENV, report_path
from bench.common import MAX_CONNECTIONS, ROOT, Figures, embedded_postgres
from bench.overhead import Sample
from bench.workers import Work, _add_floor, _add_one_at_a_time, _add_work

COUNTS = (1, 2, 4)


def verdict(ours: dict[int, list[float]], theirs: dict[int, list[float]]) -> str:
    figures = Figures("workers", "test")
    floor = {c: [Sample([], rate, 0.015, 0.005) for rate in rates] for c, rates in theirs.items()}
    # API, workers, Postgres, client and wall seconds over all turns: 200 runs a turn.
    spent = {c: [0.6, 2.4, 1.2, 0.1, 10.0] for c in COUNTS}
    _add_floor(figures, COUNTS, ours, floor, spent, 200 * 2)
    return figures.lines[-1]


def test_a_fall_from_two_processes_to_four_misses_the_target_and_says_whether_the_floor_fell():
    said = verdict(
        {1: [70.0, 72.0], 2: [80.0, 84.0], 4: [74.0, 76.0]},
        {1: [60.0, 61.0], 2: [62.0, 63.0], 4: [60.0, 62.0]},
    )
    assert "**missed** by agentrt; the floor falls too" in said
    assert "from 2 to 4: agentrt 0.91x (0.93, 0.90)" in said
    # The floor's best count is 2 (62.5 runs/s); agentrt's four do 75.0.
    assert "agentrt does 1.20x the runs/s of the floor's best count (2, 62.5 runs/s)" in said


def test_runs_per_second_that_never_fall_meet_the_target():
    said = verdict(
        {1: [70.0, 70.0], 2: [80.0, 80.0], 4: [81.0, 80.0]},
        {1: [60.0, 60.0], 2: [60.0, 61.0], 4: [62.0, 61.0]},
    )
    assert "**met** by agentrt; the floor does not fall" in said


def test_the_table_sets_each_count_of_agentrt_against_the_floor_in_the_same_turn():
    figures = Figures("workers", "test")
    floor = {c: [Sample([], 50.0, 0.015, 0.005), Sample([], 100.0, 0.017, 0.007)] for c in COUNTS}
    rates = {c: [60.0, 90.0] for c in COUNTS}
    _add_floor(figures, COUNTS, rates, floor, {c: [0.6, 2.4, 1.2, 0.1, 10] for c in COUNTS}, 400)
    row = next(line for line in figures.lines if line.startswith("| 4 |"))
    # Paired by turn: 60/50 and 90/100, median 1.05x (unpaired medians would give 1.00x).
    assert row.split(" | ")[1:4] == ["75.0", "75.0", "1.05x"]
    assert row.endswith("| 16.0 ms | 7.5 ms | 6.0 ms | 3.0 ms |")


def work_said(one: Work, two: Work) -> str:
    figures = Figures("workers", "test")
    _add_work(figures, {2: one, 4: two})
    return figures.lines[-1]


def test_calls_that_grow_less_than_cpu_read_as_the_same_work_costing_more_per_call():
    said = work_said(Work(calls=25_000, cpu=0.025), Work(calls=25_500, cpu=0.030))
    assert said.startswith("From 2 to 4 processes the calls per run are 1.02x")
    assert "the CPU per run 1.20x and the CPU per call 1.18x (the same work costs more" in said
    assert "is the machine's, not the code's" in said


def test_cpu_that_grows_with_the_calls_reads_as_more_work():
    said = work_said(Work(calls=25_000, cpu=0.025), Work(calls=30_000, cpu=0.030))
    assert "the CPU per call 1.00x (CPU follows the work)" in said
    assert "the machine's" not in said


def test_a_counting_process_reports_the_calls_it_has_made_on_sigusr1(tmp_path: Path):
    (tmp_path / "spin.py").write_text(
        "import pathlib, sys, time\n"
        "def step():\n    pass\n"
        "for _ in range(5000):\n    step()\n"
        "pathlib.Path(sys.argv[1]).write_text('ready')\n"
        "time.sleep(120)\n"
    )
    ready = tmp_path / "ready"
    env = {**os.environ, CALLS_DIR_ENV: str(tmp_path), "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    proc = subprocess.Popen([sys.executable, "-m", "bench.callcount", "spin", str(ready)], env=env)
    try:
        report = report_path(tmp_path, proc.pid)
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)
        while not report.exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        assert 5000 <= int(report.read_text()) < 50_000
    finally:
        proc.kill()
        proc.wait()


def test_one_run_at_a_time_sets_the_most_processes_postgres_cpu_against_the_fewest():
    figures = Figures("workers", "test")
    # runs/s; API, workers, Postgres, client and wall seconds; transactions per run (100 runs).
    measured = {
        1: (50.0, [0.3, 1.2, 0.60, 0.1, 2.0], 14.0),
        2: (48.0, [0.3, 1.3, 0.63, 0.1, 2.1], 15.0),
        4: (45.0, [0.3, 1.4, 0.69, 0.1, 2.2], 17.0),
    }
    _add_one_at_a_time(figures, measured, 100)
    assert "| 4 | 45.0 | 17.0 ms | 6.9 ms | 17.0 |" in figures.lines
    assert figures.lines[-1].startswith(
        "Postgres CPU per run with 4 processes against 1, one run at a time: 1.15x; 1.0 "
        "transactions more per run for each process added."
    )


def test_the_benchmarks_postgres_takes_more_connections_than_the_sections_open():
    # The workers section's floor and agentrt's API open well over Postgres's default 100.
    with embedded_postgres() as url:
        held = [psycopg.connect(url) for _ in range(150)]
        try:
            assert held[-1].execute("SHOW max_connections").fetchone() == (str(MAX_CONNECTIONS),)
        finally:
            for conn in held:
                conn.close()
