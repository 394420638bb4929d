"""The embedded PostgreSQL: shared by every agentrt process on one data folder.

Each process that uses it leaves a pid file in `<data_dir>/pg-users/`; the last one to let go
stops the server. Stopping sends SIGINT to the postmaster (Postgres' fast shutdown), which
works for any user allowed to signal it, including root, where `pg_ctl` refuses to run.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("agentrt")


def _pgdata(data_dir: Path) -> Path:
    return Path(data_dir).resolve() / "pg"


def _users_dir(data_dir: Path) -> Path:
    return Path(data_dir).resolve() / "pg-users"


@contextlib.contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    """Serialise start, register, release and stop across the processes on one data folder."""
    folder = Path(data_dir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "pg.lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):  # a zombie no one has reaped yet is gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def live_users(data_dir: Path) -> list[int]:
    """Return the pids of live processes using the embedded server; forget dead ones."""
    folder = _users_dir(data_dir)
    pids = []
    for entry in folder.glob("*") if folder.exists() else []:
        if entry.name.isdigit() and _alive(int(entry.name)):
            pids.append(int(entry.name))
        else:
            entry.unlink(missing_ok=True)
    return sorted(pids)


def postmaster_pid(data_dir: Path) -> int | None:
    """Return the pid of the embedded server if it is running."""
    try:
        pid = int((_pgdata(data_dir) / "postmaster.pid").read_text().split("\n", 1)[0])
    except (FileNotFoundError, ValueError):
        return None
    return pid if _alive(pid) else None


def start(data_dir: Path) -> str:
    """Start (or join) the embedded server, register this process as a user; return its URL."""
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, ssh, cron); pgserver
        # then falls back to a folder under /tmp, which is what we want.
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        import pgserver  # type: ignore[attr-defined,unused-ignore]

    pgdata = _pgdata(data_dir)
    pgdata.mkdir(parents=True, exist_ok=True)
    with _locked(data_dir):
        server = pgserver.get_server(pgdata, cleanup_mode=None)  # type: ignore[attr-defined]
        users = _users_dir(data_dir)
        users.mkdir(exist_ok=True)
        (users / str(os.getpid())).touch()
    return str(server.get_uri())


def release(data_dir: Path) -> bool:
    """Unregister this process; stop the server if no live user is left. Say if it stopped."""
    with _locked(data_dir):
        (_users_dir(data_dir) / str(os.getpid())).unlink(missing_ok=True)
        if live_users(data_dir):
            return False
        return _stop(data_dir)


def stop(data_dir: Path, *, force: bool = False) -> tuple[bool, list[int]]:
    """Stop the server unless live processes still use it (or `force`).

    Returns:
        Whether the server stopped, and the pids of the processes still using it.
    """
    with _locked(data_dir):
        users = [pid for pid in live_users(data_dir) if pid != os.getpid()]
        if users and not force:
            return False, users
        return _stop(data_dir), users


def _stop(data_dir: Path, timeout_s: float = 30.0) -> bool:
    pid = postmaster_pid(data_dir)
    if pid is None:
        return False
    os.kill(pid, signal.SIGINT)  # fast shutdown: roll back open transactions, then exit
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        log.warning("the embedded database (pid %d) did not stop within %g s", pid, timeout_s)
        return False
    log.info("stopped the embedded database")
    return True
