"""docs/tools.md "Add your own tool", followed literally from its code blocks."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.live import free_port
from tests.support.processes import ROOT, WorkerProcess, worker_env

pytestmark = pytest.mark.timeout(300)

AGENTRT = str(Path(sys.executable).parent / "agentrt")


def walkthrough_blocks() -> list[tuple[str, str]]:
    """The (language, code) blocks of the walkthrough section, in order."""
    text = (ROOT / "docs" / "tools.md").read_text()
    section = text.split("## Add your own tool\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", section, re.S)


def command(line: str) -> tuple[dict[str, str], list[str]]:
    """Split `VAR=value ... agentrt args` into its variables and the command."""
    words = shlex.split(line)
    variables = {}
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        variables[name] = value
    assert words[0] == "agentrt", line
    return variables, [AGENTRT, *words[1:]]


async def test_the_add_your_own_tool_walkthrough_works_as_written(
    database_url: str, tmp_path: Path
) -> None:
    blocks = walkthrough_blocks()
    assert [language for language, _ in blocks] == ["python", "json", "sh", "sh"]
    (_, module), (_, script), (_, serve_block), (_, use_block) = blocks
    filename = module.splitlines()[0].removeprefix("# ").strip()
    (tmp_path / filename).write_text(module)
    (tmp_path / "script.json").write_text(script)
    json.loads(script)

    variables, serve_argv = command(serve_block.strip())
    port = free_port()
    env = worker_env(database_url, data_dir=str(tmp_path / ".agentrt"), port=str(port))
    env.pop("PYTHONPATH", None)  # the point: the working directory is enough
    env.update(variables)
    server = WorkerProcess(
        env, serve_argv[1:], ready="Application startup complete", cwd=tmp_path, program=[AGENTRT]
    )
    base = f"http://127.0.0.1:{port}"
    try:
        await server.start(limit_s=120)
        check, use = (line for line in use_block.strip().splitlines() if line.strip())
        assert check.startswith("curl -s localhost:8000/api/tools")
        async with httpx.AsyncClient(base_url=base) as client:
            listing = (await client.get("/api/tools")).text
        assert "send_note" in listing

        _, run_argv = command(use)
        run = await asyncio.create_subprocess_exec(
            *run_argv,
            cwd=tmp_path,
            env={**env, "AGENTRT_URL": base},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(run.communicate(), 120)
        shown = output.decode()
        assert run.returncode == 0, shown
        assert '-> send_note({"text": "buy milk"})' in shown
        assert "Done: I noted it." in shown
        assert (tmp_path / "notes.txt").read_text() == "buy milk\n"
    finally:
        await server.close()
