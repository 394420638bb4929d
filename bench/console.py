"""The web console on a run of 100,000 events: time to first render, and a scroll through it.

The run is seeded straight into Postgres (COPY of its events, its record and snapshot), which
takes seconds where executing it would take minutes; the console then reads it through the
API like any other run. Figures come from the browser's own `performance` timings, in
headless Chromium: the mark the run page sets once its header, conversation and first page
of events are drawn, and the frame times while the event list scrolls from top to bottom.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

import psycopg
from playwright.async_api import Page

from bench.browser import browser_missing, chromium
from bench.common import Figures, env_for, met, processes, run_async, start_api, stat_line
from bench.seed import seed_long_run
from server.auth import create_api_key
from server.db.pool import open_pool
from server.settings import Settings

EVENTS = 100_000
TARGET_S = 2.0

# Scroll the list to its end in steps, one step per animation frame, and time each frame.
SCROLL = """async ([steps, pixels]) => {
  const list = document.querySelector('[data-testid=event-list]');
  const frames = [];
  list.scrollTop = 0;
  await new Promise((r) => requestAnimationFrame(r));
  let last = performance.now();
  for (let i = 1; i <= steps; i++) {
    list.scrollTop = pixels ? i * pixels : (list.scrollHeight - list.clientHeight) * i / steps;
    await new Promise((r) => requestAnimationFrame(r));
    const now = performance.now();
    frames.push(now - last);
    last = now;
  }
  const rows = [...list.querySelectorAll('[data-seq]')].map((r) => Number(r.dataset.seq));
  return {frames, lastSeq: Math.max(...rows)};
}"""


async def load_page(page: Page, url: str) -> tuple[float, float, float]:
    """Load `url` as a new document; return first render, all events, HTML arrived (s)."""
    await page.goto(url)
    await page.wait_for_selector("body[data-run-rendered]", timeout=60_000)
    await page.wait_for_selector("[data-loaded]", timeout=120_000)
    marks = await page.evaluate(
        "() => Object.fromEntries(performance.getEntriesByType('mark')"
        ".map((m) => [m.name, m.startTime]))"
    )
    html = await page.evaluate("() => performance.getEntriesByType('navigation')[0].responseEnd")
    return (
        marks["console:run-rendered"] / 1000,
        marks["console:events-loaded"] / 1000,
        html / 1000,
    )


async def open_run(url: str, key: str, run_id: str, repeats: int) -> dict[str, list[float]]:
    """Open the run page `repeats` times; return render and scroll timings.

    Each repeat opens it once in a fresh tab (cold: nothing cached), then again as a new
    document in a tab where the console is already open (warm: its files cached).
    """
    out: dict[str, list[float]] = {
        "cold": [],
        "cold_html": [],
        "render": [],
        "loaded": [],
        "frames": [],
        "smooth": [],
    }
    async with chromium() as browser:
        for n in range(repeats):
            context = await browser.new_context(viewport={"width": 1400, "height": 900})
            await context.add_init_script(f"sessionStorage.setItem('agentrt.apiKey', {key!r});")
            page = await context.new_page()
            cold, _, html = await load_page(page, f"{url}/console/#/runs/{run_id}")
            out["cold"].append(cold)
            out["cold_html"].append(html)
            render, loaded, _ = await load_page(page, f"{url}/console/?open={n}#/runs/{run_id}")
            out["render"].append(render)
            out["loaded"].append(loaded)
            smooth = await page.evaluate(SCROLL, [240, 40])
            out["smooth"] += [f / 1000 for f in smooth["frames"]]
            scrolled = await page.evaluate(SCROLL, [200, 0])
            assert scrolled["lastSeq"] == EVENTS, scrolled["lastSeq"]
            out["frames"] += [f / 1000 for f in scrolled["frames"]]
            await context.close()
    return out


async def measure(database_url: str, url: str, repeats: int, figures: Figures) -> None:
    """Seed the run, then time the console on it."""
    settings = Settings(database_url=database_url)
    async with open_pool(database_url, settings) as pool:
        key = await create_api_key(pool, "bench", "bench", ["admin"])
    async with await psycopg.AsyncConnection.connect(database_url) as conn, conn.transaction():
        run_id = await seed_long_run(conn, "bench", "bench", EVENTS)
    load_before = os.getloadavg()[0]
    t = await open_run(url, key, run_id, repeats)
    load_after = os.getloadavg()[0]
    render = statistics.median(t["render"])
    slow = sum(1 for f in t["frames"] if f > 1 / 30)
    slow_smooth = sum(1 for f in t["smooth"] if f > 1 / 30)
    figures.add(
        f"A completed run of {EVENTS:,} events (seeded in Postgres), in headless Chromium,"
        f" {repeats} time(s): opened in a fresh tab, then opened again as a new document in"
        " that tab. Timings from the page's `performance` marks, counted from the navigation's"
        f" start. Load average of the machine (2 cores, shared): {load_before:.1f} before,"
        f" {load_after:.1f} after."
    )
    figures.add("")
    figures.add("| measure | value | target |")
    figures.add("|---|---|---|")
    figures.add(
        "| first render of the run page (header, conversation, first 1,000 events), console"
        f" already open in the tab | {stat_line(t['render'], 's', 1)} |"
        f" < {TARGET_S:g} s {met(render < TARGET_S)} |"
    )
    figures.add(
        "| the same in a fresh tab (browser start-up of the tab, nothing cached) |"
        f" {stat_line(t['cold'], 's', 1)}; the page's HTML arrived at"
        f" {stat_line(t['cold_html'], 's', 1)} | |"
    )
    figures.add(
        f"| all {EVENTS:,} events in the list (background pages) |"
        f" {stat_line(t['loaded'], 's', 1)} | |"
    )
    figures.add(
        f"| frame time scrolling top to bottom in 200 steps | {stat_line(t['frames'])} |"
        f" {slow} of {len(t['frames'])} frames over 33 ms |"
    )
    figures.add(
        f"| frame time scrolling 40 px a frame (a wheel's pace), 240 frames |"
        f" {stat_line(t['smooth'])} | {slow_smooth} of {len(t['smooth'])} frames over 33 ms |"
    )
    figures.add("")
    figures.add(
        "Each top-to-bottom step jumps about 500 rows, so every frame draws a new set of rows"
        " (as when the scrollbar is dragged); the list keeps about 60 rows in the page."
    )


def main(database_url: str, quick: bool) -> Figures:
    """Start a server, seed the long run and measure the console's run page on it."""
    figures = Figures("Console on a 100,000-event run", "python -m bench.run --only console")
    missing = browser_missing()
    if missing is not None:
        figures.add(f"Not measured: {missing}")
        return figures
    folder = Path(tempfile.mkdtemp(prefix="agentrt-bench-console-"))
    env = env_for(database_url, auth_enabled="true", data_dir=str(folder))
    api = start_api(env)
    assert api.url is not None
    with processes([api]):
        run_async(measure(database_url, api.url, 1 if quick else 5, figures))
    return figures
