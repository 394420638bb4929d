// Operations: the queue, the workers and their heartbeats, circuit breakers, recent failures.
import { api } from "../api.js";
import { h, mount, errorBox, statusBadge, when, num } from "../ui.js";

const REFRESH_MS = 3000;

export function opsPage(main) {
  const queue = h("div", { "data-testid": "queue" });
  const workers = h("div", { "data-testid": "workers" });
  const circuits = h("div", { "data-testid": "circuits" });
  const failures = h("div", { "data-testid": "failures" });
  let timer = null;
  mount(main, h("h1", {}, "Operations"),
    h("div", { class: "panel" }, h("h2", {}, "Queue"), queue),
    h("div", { class: "panel" }, h("h2", {}, "Workers"), workers),
    h("div", { class: "panel" }, h("h2", {}, "Circuit breakers"), circuits),
    h("div", { class: "panel" }, h("h2", {}, "Recent failures"), failures));

  async function load() {
    try {
      const q = await api("/api/admin/queue");
      mount(queue, h("dl", { class: "kv" }, h("dt", {}, "Scope"), h("dd", {}, q.scope + (q.tenantId ? ` (${q.tenantId})` : "")),
        ...Object.entries(q.counts).flatMap(([s, n]) => [h("dt", {}, s), h("dd", { "data-count": s }, num(n))]),
        h("dt", {}, "Oldest queued"), h("dd", {}, q.oldestQueuedAgeSeconds == null ? "–" : `${q.oldestQueuedAgeSeconds.toFixed(1)} s ago`),
        h("dt", {}, "Expired leases"), h("dd", {}, q.expiredLeases.length ? q.expiredLeases.map((r) => h("div", {}, h("a", { href: `#/runs/${r.runId}`, class: "mono" }, r.runId), ` ${r.status}, ${r.recoveries} recoveries`)) : "none")));
      mount(workers, q.workers.length ? h("table", {}, h("tr", {}, ...["Worker", "Host", "Active runs", "Concurrency", "Last heartbeat", "Draining"].map((t) => h("th", {}, t))),
        ...q.workers.map((w) => h("tr", { class: w.heartbeatAgeSeconds > 30 ? "flagged" : "" }, h("td", { class: "mono" }, w.workerId), h("td", {}, w.host ? `${w.host}:${w.pid}` : "–"),
          h("td", {}, num(w.activeRuns)), h("td", {}, w.concurrency ?? "–"), h("td", {}, `${w.heartbeatAgeSeconds.toFixed(1)} s ago`), h("td", {}, w.draining ? "yes" : "no")))) : h("p", { class: "muted" }, "No worker holds a run."));
    } catch (err) { mount(queue, errorBox(err)); mount(workers); }
    try {
      const c = await api("/api/models/circuits");
      mount(circuits, c.circuits.length ? h("table", {}, h("tr", {}, ...["Model", "State", "Consecutive failures", "Opened", "Retry in"].map((t) => h("th", {}, t))),
        ...c.circuits.map((x) => h("tr", { class: x.state === "open" ? "dead" : "" }, h("td", { class: "mono" }, x.model), h("td", {}, x.state), h("td", {}, x.consecutiveFailures), h("td", {}, x.openedCount), h("td", {}, x.retryInS == null ? "–" : `${x.retryInS.toFixed(1)} s`))))
        : h("p", { class: "muted" }, `No model called yet (a circuit opens after ${c.threshold} failures in a row).`));
    } catch (err) { mount(circuits, errorBox(err)); }
    try {
      const f = await api("/api/console/runs?status=failed&limit=20");
      mount(failures, f.runs.length ? h("table", {}, ...f.runs.map((r) => h("tr", {}, h("td", {}, h("a", { href: `#/runs/${r.runId}`, class: "mono" }, r.runId)), h("td", {}, statusBadge(r.status)),
        h("td", { class: "k-error" }, r.error ? `${r.error.type}: ${r.error.message}` : ""), h("td", {}, when(r.finishedAt))))) : h("p", { class: "muted" }, "No failed runs."));
    } catch (err) { mount(failures, errorBox(err)); }
  }
  let alive = true;
  const tick = async () => { await load(); if (alive) timer = setTimeout(tick, REFRESH_MS); };
  tick();
  return () => { alive = false; clearTimeout(timer); };
}
