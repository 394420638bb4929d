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

pytestmark = pytest.mark.timeout(MAX_TIME + 240)


@pytest.fixture(scope="module")
async def base_url(settings: Settings) -> AsyncIterator[str]:
    secured = settings.model_copy(update={"auth_enabled": True, "max_message_chars": 2000})
    models = ModelRegistry(secured, {"hi": [ScriptedTurn(text="hello")]})
    async with serve(create_app(secured, models=models)) as url:
        yield url


async def test_the_api_conforms_to_its_openapi_schema_under_fuzzing(
    base_url: str, pool: Pool, tmp_path: Path
) -> None:
    key = await create_api_key(pool, "fuzz", "fuzzer", ["admin"])
    args = [
        f"{base_url}/openapi.json",
        f"--header=Authorization: Bearer {key}",
        f"--checks={CHECKS}",
        f"--max-examples={EXAMPLES}",
        f"--max-time={MAX_TIME}",
        "--phases=examples,coverage,fuzzing",
        "--workers=1",
        "--request-timeout=20",
        "--suppress-health-check=all",
        "--generation-allow-x00=true",
        f"--report-dir={tmp_path}",
        *([f"--seed={SEED}"] if SEED else []),
    ]
    # The CLI runs in its own process so this event loop keeps serving its requests.
    cli = Path(sys.executable).with_name("schemathesis")
    proc = await asyncio.create_subprocess_exec(
        str(cli),
        "run",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=tmp_path,  # its crash cache goes there, not into the repository
        env={**os.environ, "NO_COLOR": "1", "SCHEMATHESIS_TELEMETRY": "false"},
    )
    async with asyncio.timeout(MAX_TIME + 180):
        output, _ = await proc.communicate()
    text = output.decode(errors="replace")
    print(text)
    assert proc.returncode == 0, text[-8000:]
