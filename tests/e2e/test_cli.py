"""The `agentrt` client commands against a real server process."""

from __future__ import annotations

import asyncio
import json
import shlex
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from nodes.models.scripted import ScriptedTurn
from tests.support.live import free_port, wait_for_event
from tests.support.processes import ROOT, WorkerProcess, worker_env, write_scripts

pytestmark = pytest.mark.timeout(300)

SLOW = ScriptedTurn(text="tick " * 40, chunk_chars=5, delay_s=0.2)  # about 8 s
LONG = ScriptedTurn(text="tock " * 300, chunk_chars=5, delay_s=0.2)  # about a minute
ANSWER = ScriptedTurn(text="forty-two")


@pytest.fixture(scope="module")
def env(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("cli")
    scripts = write_scripts(
        folder / "scripts.json", {"slow": [SLOW], "long": [LONG], "answer": [ANSWER]}
    )
    return worker_env(
        database_url, data_dir=str(folder), scripted_models_file=str(scripts), drain_grace_s=1
    )


def serve(env: dict[str, str], port: int) -> WorkerProcess:
    return WorkerProcess(env, ["serve", "--port", str(port)], ready="Application startup complete")


@pytest.fixture(scope="module")
async def server(env: dict[str, str]) -> AsyncIterator[str]:
    port = free_port()
    process = await serve(env, port).start(limit_s=120)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.signal(signal.SIGTERM)
        await process.wait()
        await process.close()


def client(env: dict[str, str], url: str, *args: str) -> WorkerProcess:
    return WorkerProcess(env, ["--url", url, *args], ready="[run ")


async def agentrt(env: dict[str, str], *args: str) -> tuple[int, list[str]]:
    process = await WorkerProcess(env, list(args)).launch()
    try:
        code = await process.wait(limit_s=120)
    finally:
        await process.close()
    return code, process.output


def no_traceback(lines: list[str]) -> bool:
    return not any("Traceback" in line for line in lines)


async def test_run_follows_across_a_server_restart(env: dict[str, str]) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    first = await serve(env, port).start(limit_s=120)
    watcher = await client(env, url, "run", "count", "--model", "scripted:long").start()
    second = serve(env, port)
    try:
        run_id = watcher.output[0].split()[1]
        async with httpx.AsyncClient(base_url=url) as http:
            await wait_for_event(http, f"/api/runs/{run_id}/events", "message.item.delta")
        first.signal(signal.SIGINT)
        first.signal(signal.SIGINT)
        assert await first.wait(limit_s=60) == 0
        assert no_traceback(first.output), first.output  # an open stream ends cleanly
        await second.start(limit_s=120)
        assert await watcher.wait(limit_s=180) == 0, watcher.output
        assert no_traceback(watcher.output), watcher.output
        assert any("reconnecting" in line for line in watcher.output)
        assert ("tock " * 300).strip() in "\n".join(watcher.output)
    finally:
        await asyncio.gather(first.close(), second.close(), watcher.close())


async def test_ctrl_c_on_run_says_how_to_follow_or_cancel(env: dict[str, str], server: str) -> None:
    watcher = await client(env, server, "run", "count", "--model", "scripted:long").start()
    try:
        run_id = watcher.output[0].split()[1]
        async with httpx.AsyncClient(base_url=server) as http:
            await wait_for_event(http, f"/api/runs/{run_id}/events", "message.item.delta")
        state = watcher.signal_state()
        watcher.signal(signal.SIGINT)
        try:
            code = await watcher.wait(limit_s=30)
        except TimeoutError:
            raise AssertionError(f"`agentrt run` outlived SIGINT by 30 s ({state})") from None
        assert code == 130
        text = "\n".join(watcher.output)
        assert no_traceback(watcher.output), text
        assert f"run {run_id} continues" in text
        assert f"agentrt runs cancel {run_id}" in text
        assert f"agentrt runs events {run_id} --follow" in text
    finally:
        await watcher.close()

    code, out = await agentrt(env, "runs", "cancel", run_id, "--url", server)
    assert code == 0 and run_id in out[0] and "cancel" in out[0], out
    code, out = await agentrt(env, "--url", server, "runs", "show", run_id)
    async with asyncio.timeout(30):
        while json.loads("\n".join(out))["status"] != "cancelled":
            await asyncio.sleep(0.2)
            code, out = await agentrt(env, "--url", server, "runs", "show", run_id)


async def test_runs_list_has_a_header_and_events_read_as_lines_or_json(
    env: dict[str, str], server: str
) -> None:
    watcher = await client(env, server, "run", "hi", "--model", "scripted:answer").start()
    assert await watcher.wait(limit_s=60) == 0
    run_id = watcher.output[0].split()[1]

    code, out = await agentrt(env, "--url", server, "runs", "list")
    assert code == 0
    assert out[0].split()[:3] == ["RUN", "STATUS", "MODEL"]
    assert any(line.startswith(run_id) for line in out[1:])

    code, out = await agentrt(env, "--url", server, "runs", "events", run_id)
    assert code == 0 and no_traceback(out)
    kinds = [line.split()[2] for line in out]
    assert kinds[-1] == "run.completed" and "run.started" in kinds
    assert not any(line.lstrip().startswith("{") for line in out)

    code, out = await agentrt(env, "--url", server, "runs", "events", run_id, "--json")
    assert code == 0
    assert [json.loads(line)["type"] for line in out][-1] == "run.completed"


async def test_client_flags_and_environment_choose_the_server(
    env: dict[str, str], server: str
) -> None:
    code, out = await agentrt({**env, "AGENTRT_URL": server}, "runs", "list")
    assert code == 0 and out[0].startswith("RUN")
    dead = f"http://127.0.0.1:{free_port()}"
    code, out = await agentrt({**env, "AGENTRT_URL": server}, "runs", "list", "--url", dead)
    assert code == 1 and out == [
        f"agentrt: no server at {dead}; start one with 'make run', or point at yours with "
        "--url or AGENTRT_URL"
    ]


async def test_keys_list_and_revoke(env: dict[str, str]) -> None:
    code, out = await agentrt(env, "keys", "create", "--tenant", "acme", "--user", "ann")
    assert code == 0 and out[-1].startswith("ak_")
    code, out = await agentrt(env, "keys", "list", "--tenant", "acme")
    assert code == 0 and out[0].split()[:2] == ["ID", "TENANT"]
    key_id = out[1].split()[0]
    assert out[1].split()[1:3] == ["acme", "ann"] and out[1].endswith("active")
    code, out = await agentrt(env, "keys", "revoke", key_id)
    assert code == 0 and out == [f"revoked {key_id}"]
    code, out = await agentrt(env, "keys", "list", "--tenant", "acme")
    assert "revoked" in out[1]
    code, out = await agentrt(env, "keys", "revoke", key_id)
    assert code == 1


async def test_the_banner_try_command_works_on_the_port_in_use(
    env: dict[str, str], tmp_path: Path
) -> None:
    process = await serve(env, 0).start(limit_s=120)
    try:
        start = next(line for line in process.output if "starting on" in line)
        assert start.endswith("event loop uvloop)"), start  # installed with agentrt
        port = start.split("http://127.0.0.1:")[1].split()[0]
        command = next(line for line in process.output if "try:" in line).split("try:")[1]
        argv = shlex.split(command)
        assert f"http://127.0.0.1:{port}" in argv
        assert argv[:3] == ["python", "-m", "server.cli"]  # as this process was started
        run = await asyncio.create_subprocess_exec(
            sys.executable, *argv[1:], cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE
        )
        output, _ = await asyncio.wait_for(run.communicate(), 120)
        assert run.returncode == 0, output
        assert b"42" in output
    finally:
        process.signal(signal.SIGTERM)
        await process.wait()
        await process.close()
