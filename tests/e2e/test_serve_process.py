"""A real `agentrt serve` process: fast, one-line start-up failures and a drain that talks.

Also the draining shutdown: the first SIGINT says what it waits for and hands runs back within
the grace period; a second one hands them back at once.
"""

from __future__ import annotations

import asyncio
import signal
import socket
from pathlib import Path

import httpx
import psycopg
import pytest

from nodes.models.scripted import ScriptedTurn
from tests.support.live import free_port, wait_for_status
from tests.support.processes import WorkerProcess, worker_env, write_scripts

pytestmark = pytest.mark.timeout(300)

SLOW = ScriptedTurn(text="tick " * 200, chunk_chars=5, delay_s=0.25)  # about a minute


def serve(env: dict[str, str], port: int, *extra: str) -> WorkerProcess:
    return WorkerProcess(
        env, ["serve", "--port", str(port), *extra], ready="Application startup complete"
    )


def has_traceback(lines: list[str]) -> bool:
    found = [line for line in lines if "Traceback" in line]
    print("\n".join(found)[-3000:])
    return bool(found)


async def test_a_bad_database_url_fails_in_one_line(tmp_path: Path) -> None:
    env = worker_env("notaurl", data_dir=str(tmp_path))
    process = await serve(env, free_port()).launch()
    try:
        assert await process.wait(limit_s=60) == 2
        lines = [line for line in process.output if line.strip()]
        assert len(lines) == 1, lines
        assert "DATABASE_URL" in lines[0] and "postgresql://" in lines[0]
    finally:
        await process.close()


async def test_an_unreachable_database_fails_in_one_line(tmp_path: Path) -> None:
    url = f"postgresql://agentrt:secret@127.0.0.1:{free_port()}/agentrt"
    process = await serve(worker_env(url, data_dir=str(tmp_path)), free_port()).launch()
    try:
        assert await process.wait(limit_s=60) == 2
        lines = [line for line in process.output if line.strip()]
        assert len(lines) == 1, lines
        assert "cannot connect to the database" in lines[0] and "secret" not in lines[0]
    finally:
        await process.close()


async def test_an_unusable_default_model_is_refused_naming_the_fix(
    database_url: str, tmp_path: Path
) -> None:
    env = worker_env(database_url, data_dir=str(tmp_path), default_model="openai:gpt-4o-mini")
    process = await serve(env, free_port()).launch()
    try:
        assert await process.wait(limit_s=60) == 2
        assert "AGENTRT_OPENAI_API_KEY" in "\n".join(process.output)
        assert not has_traceback(process.output)
    finally:
        await process.close()


async def test_a_busy_port_is_refused_before_any_worker_starts(
    database_url: str, tmp_path: Path
) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        process = await serve(worker_env(database_url, data_dir=str(tmp_path)), port).launch()
        try:
            assert await process.wait(limit_s=60) == 2
            text = "\n".join(process.output)
            assert f"127.0.0.1:{port}" in text and "--port" in text
            assert "agentrt ready" not in text and not has_traceback(process.output)
        finally:
            await process.close()
    with psycopg.connect(database_url) as conn:
        tables = conn.execute("SELECT to_regclass('workers') IS NOT NULL").fetchone()
        assert tables is not None
        if tables[0]:
            assert conn.execute("SELECT count(*) FROM workers").fetchone() == (0,)


async def _start_slow_run(base: str) -> str:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        conv = (await client.post("/api/conversations", json={})).json()["conversationId"]
        run = (
            await client.post(
                f"/api/conversations/{conv}/messages",
                json={"content": "count", "model": "scripted:slow"},
            )
        ).json()
        await wait_for_status(client, run["runId"], "running", limit_s=60)
    return str(run["runId"])


def _run_row(database_url: str, run_id: str) -> tuple[str, list[str]]:
    with psycopg.connect(database_url) as conn:
        status = conn.execute("SELECT status FROM runs WHERE id = %s", (run_id,)).fetchone()
        kinds = conn.execute(
            "SELECT type FROM run_events WHERE run_id = %s ORDER BY seq", (run_id,)
        ).fetchall()
    assert status is not None
    return str(status[0]), [k[0] for k in kinds]


async def test_sigint_drains_within_the_grace_period_and_requeues_the_run(
    database_url: str, tmp_path: Path
) -> None:
    scripts = write_scripts(tmp_path / "scripts.json", {"slow": [SLOW]})
    env = worker_env(
        database_url, data_dir=str(tmp_path), scripted_models_file=str(scripts), drain_grace_s=3
    )
    port = free_port()
    process = await serve(env, port).start(limit_s=120)
    try:
        run_id = await _start_slow_run(f"http://127.0.0.1:{port}")
        process.signal(signal.SIGINT)
        await process.wait_for_output(
            "draining 1 runs, up to 3 s; press Ctrl-C again to stop now", limit_s=30
        )
        assert await process.wait(limit_s=60) == 0
        assert not has_traceback(process.output), process.output
        status, kinds = _run_row(database_url, run_id)
        assert status == "queued" and kinds[-1] == "run.requeued"
    finally:
        await process.close()


async def test_a_second_sigint_hands_runs_back_at_once(database_url: str, tmp_path: Path) -> None:
    scripts = write_scripts(tmp_path / "scripts.json", {"slow": [SLOW]})
    env = worker_env(
        database_url, data_dir=str(tmp_path), scripted_models_file=str(scripts), drain_grace_s=600
    )
    port = free_port()
    process = await serve(env, port).start(limit_s=120)
    try:
        run_id = await _start_slow_run(f"http://127.0.0.1:{port}")
        process.signal(signal.SIGINT)
        await process.wait_for_output("up to 600 s; press Ctrl-C again", limit_s=30)
        process.signal(signal.SIGINT)
        assert await process.wait(limit_s=90) == 0  # far less than the 600 s grace
        assert not has_traceback(process.output), process.output
        status, kinds = _run_row(database_url, run_id)
        assert status == "queued" and kinds[-1] == "run.requeued"
    finally:
        await process.close()


async def test_an_idle_connection_stays_usable_for_the_configured_keep_alive(
    database_url: str, tmp_path: Path
) -> None:
    # Clients and load balancers reuse idle connections. A server that closes one first races
    # the client's next request on it, which then fails; so the keep-alive time is a setting.
    env = worker_env(database_url, data_dir=str(tmp_path), http_keep_alive_s=60)
    port = free_port()
    process = await serve(env, port, "--no-workers").start(limit_s=120)
    request = b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n"
    try:
        reader, writer = await _connect(port)
        for _ in range(2):
            writer.write(request)
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            assert head.startswith(b"HTTP/1.1 200"), head
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await asyncio.wait_for(reader.readexactly(length), 30)
            # Idle past the HTTP server's own default (5 s): the idleness is what is tested.
            await asyncio.sleep(6)
        writer.close()
    finally:
        await process.close()


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    # The start-up line comes before the socket listens; retry until it does.
    async with asyncio.timeout(60):
        while True:
            try:
                return await asyncio.open_connection("127.0.0.1", port)
            except ConnectionRefusedError:
                await asyncio.sleep(0.1)
