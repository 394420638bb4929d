"""CPU-bound tools for tests: work that holds the GIL far longer than any tool timeout."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tools.spec import agent_tool


def _backtrack(size: int, pid_file: str) -> str:
    if pid_file:
        Path(pid_file).write_text(str(os.getpid()))
    # Catastrophic backtracking: the match runs in C without releasing the GIL, for ~1.6**size
    # steps (centuries at the default size).
    return str(bool(re.match(r"(a|aa)+$", "a" * size + "b")))


@agent_tool(cpu_heavy=True)
def crunch(size: int = 80, pid_file: str = "") -> str:
    """Work on a hard pattern-matching problem; it does not finish in any reasonable time.

    Args:
        size: How hard the problem is.
        pid_file: Write the id of the process doing the work to this file, if given.
    """
    return _backtrack(size, pid_file)


@agent_tool
def crunch_in_thread(size: int = 80, pid_file: str = "") -> str:
    """The same work as `crunch`, not declared CPU-heavy (it runs in a thread).

    Args:
        size: How hard the problem is.
        pid_file: Write the id of the process doing the work to this file, if given.
    """
    return _backtrack(size, pid_file)
