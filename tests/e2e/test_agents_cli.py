"""`agentrt agents ...`, `agentrt run --agent` and `agentrt runs show --context` against a real
server process whose profile files are synced when it starts."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from nodes.models.scripted import ScriptedTurn
from tests.support.live import free_port
from tests.support.processes import WorkerProcess, worker_env, write_scripts

pytestmark = pytest.mark.timeout(300)


async def agentrt(env: dict[str, str], *args: str) -> tuple[int, list[str]]:
    process = await WorkerProcess(env, list(args)).launch()
    try:
        code = await process.wait(limit_s=120)
    finally:
        await process.close()
    return code, process.output


async def test_agents_commands_and_the_context_of_a_run(database_url: str, tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "filed.yaml").write_text("name: filed\ndescription: From a file.\n")
    scripts = write_scripts(tmp_path / "scripts.json", {"answer": [ScriptedTurn(text="42")]})
    env = worker_env(
        database_url,
        data_dir=str(tmp_path),
        scripted_models_file=str(scripts),
        agents_dir=str(agents),
        drain_grace_s=1,
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = WorkerProcess(
        env, ["serve", "--port", str(port)], ready="Application startup complete"
    )
    await server.start(limit_s=120)
    try:
        profile = tmp_path / "support.yaml"
        profile.write_text("name: support\ninstructions: You help.\nmodel: scripted:answer\n")
        code, out = await agentrt(env, "--url", url, "agents", "create", str(profile))
        assert code == 0 and out[-1] == "agent support created: version 1", out
        profile.write_text("instructions: You help, briefly.\nmodel: scripted:answer\n")
        code, out = await agentrt(env, "--url", url, "agents", "update", "support", str(profile))
        assert code == 0 and out[-1] == "agent support: version 2", out

        code, out = await agentrt(env, "--url", url, "agents", "list")
        assert code == 0
        listed = {line.split()[0]: line.split()[1] for line in out[1:]}
        assert listed == {"default": "0", "filed": "1", "support": "2"}
        code, out = await agentrt(env, "--url", url, "agents", "show", "support@1")
        assert code == 0 and '"instructions": "You help."' in "\n".join(out)

        code, out = await agentrt(env, "--url", url, "run", "hi", "--agent", "support")
        assert code == 0, out
        run_id = out[0].split()[1]
        code, out = await agentrt(env, "--url", url, "runs", "show", run_id, "--context")
        text = "\n".join(out)
        assert code == 0, text
        assert f"run {run_id}: agent support@2" in text
        assert "step 1 attempt 1: scripted:answer (estimate:chars/4)" in text
        for section in ("instructions", "identity", "summary", "history", "current"):
            assert f"  {section} " in text

        code, out = await agentrt(env, "--url", url, "run", "hi", "--agent", "nope")
        assert code == 1 and len(out) == 1
        assert out[0].startswith("agentrt: 422: agent 'nope' does not exist for your tenant")
    finally:
        server.signal(signal.SIGTERM)
        await server.wait()
        await server.close()

    # A broken profile file stops the start-up in one line.
    (agents / "broken.yaml").write_text("name: broken\nmaxSteps: many\n")
    code, out = await agentrt(env, "serve", "--port", str(free_port()))
    assert code == 2
    assert any("cannot start: agent profile file refused:" in line for line in out), out
    assert not any("Traceback" in line for line in out)
