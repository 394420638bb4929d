"""Headless Chromium for the console's tests and benchmark: Debian's package, via Playwright.

Playwright never downloads a browser here: it launches the system's Chromium (`make test`
installs Debian's `chromium` package when it is missing and it can). Where it cannot be
installed, the tests fail with how to install it, unless AGENTRT_SKIP_BROWSER_TESTS=1.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from playwright.async_api import Browser, async_playwright

CHROMIUM = Path(os.environ.get("AGENTRT_CHROMIUM", "/usr/bin/chromium"))
# This machine's closed network refuses Chromium's background connections; without these
# flags it waits on them.
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SKIP_ENV = "AGENTRT_SKIP_BROWSER_TESTS"
INSTALL_HINT = (
    f"no Chromium at {CHROMIUM}. Install it: on Debian or Ubuntu `make test` does it when run "
    "as root (or run `apt-get install chromium`); elsewhere install Chromium or Chrome and set "
    f"AGENTRT_CHROMIUM to its executable. To run the other tests without a browser, set "
    f"{SKIP_ENV}=1."
)


def browser_missing() -> str | None:
    """Say why no browser can be launched, or None when Chromium is there."""
    return None if CHROMIUM.exists() else INSTALL_HINT


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """Launch headless Chromium; close it at the end."""
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield browser
        finally:
            await browser.close()
