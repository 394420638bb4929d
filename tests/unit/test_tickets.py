"""A ticket names the same worker in every process, and spreads runs over the workers."""

from __future__ import annotations

import collections
import os
import subprocess
import sys

from server.runs.tickets import named_worker

LIVE = ["host:1:a", "host:2:b", "host:3:c"]


def test_no_worker_is_named_when_none_is_live():
    assert named_worker("r_1", []) is None


def test_tickets_spread_runs_over_the_live_workers():
    named = collections.Counter(named_worker(f"r_{i:05d}", LIVE) for i in range(3000))
    assert set(named) == set(LIVE)
    assert all(800 <= n <= 1200 for n in named.values()), named


def test_every_process_names_the_same_worker_whatever_its_hash_seed():
    ids = [f"r_{i}" for i in range(50)]
    here = [named_worker(run_id, LIVE) for run_id in ids]
    code = (
        "from server.runs.tickets import named_worker\n"
        f"print([named_worker(r, {LIVE!r}) for r in {ids!r}])"
    )
    for seed in ("1", "2"):
        out = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert out.strip() == repr(here)
