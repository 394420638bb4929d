"""Run a module with cProfile counting its main thread's function calls.

`python -m bench.callcount <module> [args...]` runs `<module>` as `python -m <module>` would.
On SIGUSR1 the process writes the function calls made so far (Python and built-in, each
counted once per call) to `$BENCH_CALLS_DIR/<pid>`, replacing the file in one rename. Taking
two readings around a batch of runs gives the work a process did for them, in a unit that does
not depend on how fast the machine ran it: the workers benchmark sets it against CPU per run.
"""

from __future__ import annotations

import cProfile
import os
import runpy
import signal
import sys
from pathlib import Path
from types import FrameType

CALLS_DIR_ENV = "BENCH_CALLS_DIR"


def calls_so_far(profile: cProfile.Profile) -> int:
    """Function calls the profile has counted (its statistics need it stopped for a moment)."""
    profile.disable()
    try:
        return sum(entry.callcount for entry in profile.getstats())
    finally:
        profile.enable()


def report_path(folder: Path, pid: int) -> Path:
    """Where the process `pid` writes its count."""
    return folder / str(pid)


def main() -> None:
    """Count calls while the module given on the command line runs."""
    module, sys.argv = sys.argv[1], sys.argv[1:]
    out = report_path(Path(os.environ[CALLS_DIR_ENV]), os.getpid())
    profile = cProfile.Profile()

    def report(_signum: int, _frame: FrameType | None) -> None:
        partial = out.with_suffix(".partial")
        partial.write_text(str(calls_so_far(profile)))
        partial.replace(out)

    signal.signal(signal.SIGUSR1, report)
    profile.enable()
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
