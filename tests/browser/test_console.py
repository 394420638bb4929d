"""The web console in a real headless Chromium: sign in, live runs, approvals, cancel, traces, cost.

One server and one browser serve the whole module; runs use scripted models, so every run is
deterministic. Waits are Playwright's auto-waiting expectations on what the page shows.
"""

from __future__ import annotations

import asyncio
import re

import psycopg
from playwright.async_api import BrowserContext, Page, Route, expect

from bench.seed import seed_long_run
from tests.browser.conftest import STORY, Console, shot, start_run
from tests.support.live import wait_for_status


async def test_sign_in_refuses_a_wrong_key_and_then_shows_the_runs(
    context: BrowserContext, console: Console
) -> None:
    await start_run(console, "email")
    page = await context.new_page()
    await page.goto(f"{console.url}/console/")
    await expect(page.get_by_label("API key")).to_be_visible()
    await shot(page, "sign-in")
    await page.get_by_label("API key").fill("ak_not-a-key")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_role("alert")).to_contain_text("unknown or revoked API key")
    await page.get_by_label("API key").fill(console.key)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.get_by_test_id("runs-table")).to_contain_text("scripted:email")
    await expect(page.locator("#nav")).to_be_visible()


RECORD_TEXTS = """
window.__texts = [];
new MutationObserver(() => {
  const item = document.querySelector('[data-testid=assistant-item]');
  const text = item ? item.textContent : '';
  if (text && window.__texts[window.__texts.length - 1] !== text) window.__texts.push(text);
}).observe(document, {subtree: true, childList: true, characterData: true});
"""


async def test_a_run_streams_live_and_a_reload_mid_stream_repeats_and_loses_nothing(
    page: Page, console: Console
) -> None:
    run_id = await start_run(console, "story")
    await page.goto(f"{console.url}/console/#/runs/{run_id}")
    item = page.get_by_test_id("assistant-item")
    await expect(item).to_have_text(re.compile(r"\S"))
    seen = await item.inner_text()
    assert STORY.startswith(seen) and len(seen) < len(STORY), "the answer was not streaming"
    await expect(page.get_by_test_id("stream-state")).to_have_text("(live)")
    await shot(page, "run-streaming")

    # Record every text the answer shows after the reload: each must be a prefix of the story.
    await page.add_init_script(RECORD_TEXTS)
    await page.reload()
    await expect(page.get_by_test_id("run-status")).to_have_text("completed")
    await expect(item).to_have_count(1)
    await expect(item).to_have_text(STORY)
    texts = await page.evaluate("window.__texts")
    assert texts, "nothing was recorded after the reload"
    wrong = [t for t in texts if not STORY.startswith(t)]
    assert wrong == [], f"repeated or missing text after the reload: {wrong[:2]}"
    snapshot = await console.client.get(f"/api/runs/{run_id}/snapshot", headers=console.headers)
    assert snapshot.json()["output"] == STORY


async def test_approving_a_waiting_call_finishes_the_run_and_leaves_every_queue(
    context: BrowserContext, page: Page, console: Console
) -> None:
    run_id = await start_run(console, "email")
    await wait_for_status(console.client, run_id, "waiting_user", headers=console.headers)
    other = await context.new_page()
    for p in (page, other):
        await p.goto(f"{console.url}/console/#/approvals")
    card = page.locator(f"[data-testid=approval]:has(a[href='#/runs/{run_id}'])")
    other_card = other.locator(f"[data-testid=approval]:has(a[href='#/runs/{run_id}'])")
    await expect(card).to_contain_text("send_email")
    await expect(card).to_contain_text("ops@example.com")
    await expect(other_card).to_be_visible()
    await shot(page, "approvals")

    # Arguments that break the tool's schema are refused before anything is sent.
    await card.get_by_label("arguments").fill('{"to": 7, "subject": "hi"}')
    await card.get_by_role("button", name="Approve with edited arguments").click()
    await expect(card.get_by_role("alert")).to_contain_text("arguments.to must be string")
    await card.get_by_label("arguments").fill('{"to": "boss@example.com", "subject": "hi"}')
    await card.get_by_role("button", name="Approve with edited arguments").click()

    await expect(card).to_have_count(0)
    await expect(other_card).to_have_count(0)
    await page.goto(f"{console.url}/console/#/runs/{run_id}")
    await expect(page.get_by_test_id("run-status")).to_have_text("completed")
    await expect(page.get_by_test_id("conversation")).to_contain_text("Sent.")
    approvals = await console.client.get(f"/api/runs/{run_id}/approvals", headers=console.headers)
    (decided,) = approvals.json()["approvals"]
    assert decided["status"] == "edited"
    assert decided["decision"]["args"] == {"to": "boss@example.com", "subject": "hi"}


async def test_a_run_that_ends_while_its_page_loads_shows_its_end(
    page: Page, console: Console
) -> None:
    # The page reads the run record and its snapshot side by side. Here the run ends between
    # the two reads: the record says waiting_user, the snapshot that it completed.
    run_id = await start_run(console, "email")
    await wait_for_status(console.client, run_id, "waiting_user", headers=console.headers)
    held, release = asyncio.Event(), asyncio.Event()

    async def hold(route: Route) -> None:
        held.set()
        await release.wait()
        await route.continue_()

    await page.route(f"**/api/runs/{run_id}/snapshot", hold)
    async with page.expect_response(lambda r: r.url.endswith(f"/api/runs/{run_id}")) as record:
        await page.goto(f"{console.url}/console/#/runs/{run_id}")
    assert (await (await record.value).json())["status"] == "waiting_user"
    await asyncio.wait_for(held.wait(), 30)
    approvals = await console.client.get(f"/api/runs/{run_id}/approvals", headers=console.headers)
    (pending,) = approvals.json()["approvals"]
    decided = await console.client.post(
        f"/api/approvals/{pending['approvalId']}",
        json={"decision": "approve"},
        headers=console.headers,
    )
    assert decided.status_code == 200, decided.text
    await wait_for_status(console.client, run_id, "completed", headers=console.headers)
    release.set()

    await expect(page.get_by_test_id("stream-state")).to_have_text("(finished)")
    await expect(page.get_by_test_id("run-status")).to_have_text("completed")
    await expect(page.get_by_role("button", name="Cancel")).to_have_count(0)


async def test_rejecting_needs_a_reason(page: Page, console: Console) -> None:
    run_id = await start_run(console, "email")
    await wait_for_status(console.client, run_id, "waiting_user", headers=console.headers)
    await page.goto(f"{console.url}/console/#/approvals")
    card = page.locator(f"[data-testid=approval]:has(a[href='#/runs/{run_id}'])")
    await card.get_by_role("button", name="Reject").click()
    await expect(card.get_by_role("alert")).to_contain_text("Say why you reject it")
    await card.get_by_placeholder("reason (required to reject)").fill("not to that address")
    await card.get_by_role("button", name="Reject").click()
    await expect(card).to_have_count(0)
    await wait_for_status(console.client, run_id, "completed", headers=console.headers)


async def test_cancel_stops_a_running_run_from_its_page(page: Page, console: Console) -> None:
    run_id = await start_run(console, "long")
    await page.goto(f"{console.url}/console/#/runs/{run_id}")
    await expect(page.get_by_test_id("assistant-item")).to_have_text(re.compile(r"x"))
    await page.get_by_role("button", name="Cancel").click()
    await expect(page.get_by_test_id("run-status")).to_have_text("cancelled")
    await expect(page.get_by_test_id("stream-state")).to_have_text("(ended)")
    record = await console.client.get(f"/api/runs/{run_id}", headers=console.headers)
    assert record.json()["status"] == "cancelled"


async def test_a_waiting_run_is_paused_resumed_and_cancelled_from_its_page(
    page: Page, console: Console
) -> None:
    run_id = await start_run(console, "email")
    await wait_for_status(console.client, run_id, "waiting_user", headers=console.headers)
    await page.goto(f"{console.url}/console/#/runs/{run_id}")
    status = page.get_by_test_id("run-status")
    await expect(status).to_have_text("waiting_user")
    await page.get_by_role("button", name="Pause").click()
    await expect(status).to_have_text("paused")
    await page.get_by_role("button", name="Resume").click()
    await expect(status).to_have_text("waiting_user")
    await page.get_by_role("button", name="Cancel").click()
    await expect(status).to_have_text("cancelled")
    await expect(page.get_by_role("button", name="Cancel")).to_have_count(0)
    record = await console.client.get(f"/api/runs/{run_id}", headers=console.headers)
    assert record.json()["status"] == "cancelled"


async def test_a_failed_run_shows_its_failing_span(page: Page, console: Console) -> None:
    run_id = await start_run(console, "broken")
    await wait_for_status(console.client, run_id, "failed", headers=console.headers)
    trace = (await console.client.get(f"/api/runs/{run_id}/trace", headers=console.headers)).json()
    failed = trace["failedSpan"]
    assert failed is not None

    await page.goto(f"{console.url}/console/#/runs?status=failed")
    await page.locator(f"a[href='#/runs/{run_id}']").click()
    await expect(page.get_by_test_id("run-error")).to_contain_text("provider answered 500")
    await page.get_by_role("button", name="Trace").click()
    span = page.get_by_test_id("failing-span")
    await expect(span).to_have_count(1)
    await expect(span).to_have_attribute("data-span", failed["spanId"])
    await expect(span).to_contain_text(failed["name"])
    await shot(page, "run-trace-failed")


async def test_a_runs_cost_on_the_page_equals_the_usage_api(page: Page, console: Console) -> None:
    run_id = await start_run(console, "priced", agent="planner")
    await wait_for_status(console.client, run_id, "completed", headers=console.headers)
    usage = (await console.client.get(f"/api/runs/{run_id}/usage", headers=console.headers)).json()
    cost = usage["totals"]["cost"]
    assert cost not in (None, "0")

    await page.goto(f"{console.url}/console/#/runs/{run_id}")
    await expect(page.get_by_test_id("run-cost")).to_have_text(f"${cost}")
    await page.get_by_role("button", name="Usage").click()
    await expect(page.get_by_test_id("usage-cost")).to_have_text(f"${cost}")
    await shot(page, "run-usage")
    await page.get_by_role("button", name="Plan").click()
    await expect(page.get_by_test_id("plan")).to_contain_text("Draft the answer")
    await shot(page, "run-plan")
    await page.get_by_role("button", name="Context").click()
    manifests = page.locator("details")
    await expect(manifests).to_have_count(2)
    await manifests.first.locator("summary").click()
    await expect(manifests.first).to_contain_text("instructions")
    await shot(page, "run-context")
    await page.get_by_role("button", name="Children").click()
    await expect(page.get_by_text("No child runs.")).to_be_visible()
    await page.get_by_role("button", name="Timeline").click()
    await expect(page.get_by_test_id("time-axis").locator("svg rect").first).to_be_visible()
    await expect(page.get_by_test_id("event-list")).to_contain_text("run.completed")
    await page.locator("[data-testid=event-list] [data-seq='1']").click()
    await expect(page.get_by_test_id("event-detail")).to_contain_text("run.created")
    await shot(page, "run-timeline")


async def test_usage_charts_open_the_runs_behind_a_bar(page: Page, console: Console) -> None:
    run_id = await start_run(console, "priced")
    await wait_for_status(console.client, run_id, "completed", headers=console.headers)
    await page.goto(f"{console.url}/console/#/usage")
    bar = page.locator("[data-testid=chart-model] rect[data-key='scripted:priced']")
    await expect(bar).to_have_count(1)
    await expect(page.get_by_test_id("chart-day")).to_be_visible()
    await shot(page, "usage")
    await bar.click()
    await expect(page).to_have_url(re.compile(r"#/runs\?.*model=scripted%3Apriced"))
    table = page.get_by_test_id("runs-table")
    await expect(table.locator(f"tr[data-run='{run_id}']")).to_have_count(1)
    await expect(table).not_to_contain_text("scripted:story")


async def test_the_runs_list_filters_by_status_and_shows_counts(
    page: Page, console: Console
) -> None:
    # Its own completed and failed runs: the test passes alone, and in any order.
    completed, failed = await start_run(console, "priced"), await start_run(console, "broken")
    await wait_for_status(console.client, completed, "completed", headers=console.headers)
    await wait_for_status(console.client, failed, "failed", headers=console.headers)
    await page.goto(f"{console.url}/console/#/runs")
    counts = page.get_by_test_id("status-counts")
    await expect(counts.locator("[data-status=completed] .n")).not_to_have_text("0")
    await counts.locator("[data-status=failed]").click()
    await expect(page).to_have_url(re.compile(r"status=failed"))
    rows = page.get_by_test_id("runs-table").locator("tbody tr")
    await expect(rows.first).to_contain_text("failed")
    statuses = await rows.locator("td:nth-child(2) .badge").all_inner_texts()
    assert statuses and set(statuses) == {"failed"}
    await counts.get_by_role("button", name=re.compile("^all")).click()
    await expect(rows.locator(".s-completed").first).to_be_visible()
    await shot(page, "runs")


async def test_the_memory_and_operations_pages_show_what_the_api_says(
    page: Page, console: Console
) -> None:
    failed = await start_run(console, "broken")  # a recent failure for the operations page
    await wait_for_status(console.client, failed, "failed", headers=console.headers)
    added = await console.client.post(
        "/api/memories",
        json={"text": "Alice prefers answers in French.", "kind": "preference"},
        headers=console.headers,
    )
    assert added.status_code == 201, added.text
    await page.goto(f"{console.url}/console/#/memory")
    row = page.locator(f"tr[data-memory='{added.json()['id']}']")
    await expect(row).to_contain_text("prefers answers in French")
    await shot(page, "memory")
    page.once("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
    await row.get_by_role("button", name="Delete").click()
    await expect(row).to_have_count(0)
    gone = await console.client.get(f"/api/memories/{added.json()['id']}", headers=console.headers)
    assert gone.status_code == 404

    await page.goto(f"{console.url}/console/#/ops")
    await expect(page.get_by_test_id("queue")).to_contain_text("tenant")
    await expect(page.get_by_test_id("failures")).to_contain_text("provider answered 500")
    await shot(page, "operations")


async def test_a_run_of_100000_events_opens_and_scrolls_to_its_last_event(
    page: Page, console: Console, database_url: str
) -> None:
    async with await psycopg.AsyncConnection.connect(database_url) as conn, conn.transaction():
        run_id = await seed_long_run(conn, "acme", "alice", 100_000)
    await page.goto(f"{console.url}/console/#/runs/{run_id}")
    await expect(page.get_by_test_id("run-status")).to_have_text("completed")
    await expect(page.get_by_test_id("event-count")).to_have_text("(100,000)")
    listing = page.get_by_test_id("event-list")
    rows = await listing.locator(".row").count()
    assert rows < 200, f"{rows} rows in the DOM: the list is not virtualised"
    await listing.evaluate("(el) => { el.scrollTop = el.scrollHeight; }")
    await expect(listing.locator("[data-seq='100000']")).to_contain_text("run.completed")
    await listing.locator("[data-seq='100000']").click()
    await expect(page.get_by_test_id("event-detail")).to_contain_text('"seq": 100000')
