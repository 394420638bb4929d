"""Schemathesis over `/openapi.json`: no server error, every status and body as documented.

The suite runs a small budget; `make fuzz` runs the same test with a large one
(`FUZZ_EXAMPLES`, `FUZZ_MAX_TIME`, `FUZZ_SEED` tune it).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from nodes.models.scripted import ScriptedTurn
from server.app import create_app
from server.auth import create_api_key
from server.db.pool import Pool
from server.settings import Settings
from server.usage.registry import ModelRegistry
from tests.support.live import serve

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "5"))
MAX_TIME = int(os.environ.get("FUZZ_MAX_TIME", "40"))
SEED = os.environ.get("FUZZ_SEED")
CHECKS = "not_a_server_error,status_code_conformance,response_schema_conformance"

pytestmark = pytest.mark.timeout(2 * MAX_TIME + 360)


@pytest.fixture(scope="module")
async def base_url(settings: Settings) -> AsyncIterator[str]:
    secured = settings.model_copy(update={"auth_enabled": True, "max_message_chars": 2000})
    models = ModelRegistry(secured, {"hi": [ScriptedTurn(text="hello")]})
    async with serve(create_app(secured, models=models)) as url:
        yield url


# Erasing a user revokes their keys: fuzzed with the others, it erases the fuzzer itself once
# it guesses the user id (which responses show), and every operation after answers 401. It is
# fuzzed on its own, last.
SELF_ERASING = "DELETE /api/users/{user_id}/data"


async def _schemathesis(base_url: str, key: str, report_dir: Path, *args: str) -> str:
    """Run the schemathesis CLI with `args`; return its output, failing the test on findings."""
    common = [
        f"{base_url}/openapi.json",
        f"--header=Authorization: Bearer {key}",
        f"--checks={CHECKS}",
        "--workers=1",
        "--request-timeout=20",
        "--suppress-health-check=all",
        "--generation-allow-x00=true",
        f"--report-dir={report_dir}",
        *([f"--seed={SEED}"] if SEED else []),
    ]
    # The CLI runs in its own process so this event loop keeps serving its requests.
    cli = Path(sys.executable).with_name("schemathesis")
    proc = await asyncio.create_subprocess_exec(
        str(cli),
        "run",
        *common,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=report_dir,  # its crash cache goes there, not into the repository
        env={**os.environ, "NO_COLOR": "1", "SCHEMATHESIS_TELEMETRY": "false"},
    )
    async with asyncio.timeout(MAX_TIME + 180):
        output, _ = await proc.communicate()
    text = output.decode(errors="replace")
    print(text)
    assert proc.returncode == 0, text[-8000:]
    return text


async def test_the_api_conforms_to_its_openapi_schema_under_fuzzing(
    base_url: str, pool: Pool, tmp_path: Path
) -> None:
    key = await create_api_key(pool, "fuzz", "fuzzer", ["admin"])
    await _schemathesis(
        base_url,
        key,
        tmp_path,
        f"--max-examples={EXAMPLES}",
        f"--max-time={MAX_TIME}",
        "--phases=examples,coverage,fuzzing",
        f"--exclude-name={SELF_ERASING}",
    )
    # Every operation was fuzzed with a working key: none of them locked the fuzzer out.
    async with httpx.AsyncClient(base_url=base_url) as client:
        me = await client.get("/api/usage", headers={"Authorization": f"Bearer {key}"})
    assert me.status_code == 200, me.text
    await _schemathesis(
        base_url,
        key,
        tmp_path,
        f"--max-examples={EXAMPLES}",
        "--phases=examples,coverage,fuzzing",
        f"--include-name={SELF_ERASING}",
    )
