// Runs: the filtered list with counts per status, refreshed live; stuck and dead-lettered runs stand out.
import { api, query } from "../api.js";
import { h, mount, statusBadge, badge, errorBox, when, money } from "../ui.js";

const STATUSES = ["queued", "running", "waiting_tool", "waiting_user", "paused", "completed", "failed", "cancelled"];
const FIELDS = ["status", "agent", "user", "model", "since", "until", "minCost", "flag"];
const REFRESH_MS = 2000;

export function runsPage(main, q) {
  const filters = Object.fromEntries(FIELDS.map((f) => [f, q.get(f) || ""]));
  const counts = h("div", { class: "tabs counts", "data-testid": "status-counts" });
  const table = h("tbody");
  const errors = h("div");
  const more = h("button", { hidden: true, onclick: () => load(cursor, true) }, "More");
  let cursor = null;
  let timer = null;

  const go = (changes) => {
    const next = { ...filters, ...changes };
    location.hash = "#/runs" + query(next);
  };
  const input = (name, label, attrs = {}) => h("label", {}, label,
    h("input", { name, value: filters[name], ...attrs, onchange: (e) => go({ [name]: e.target.value }) }));
  const form = h("div", { class: "filters panel" },
    input("agent", "Profile", { placeholder: "any" }),
    input("user", "User", { placeholder: "any" }),
    input("model", "Model", { placeholder: "any" }),
    input("since", "Created from", { type: "datetime-local" }),
    input("until", "Created before", { type: "datetime-local" }),
    input("minCost", "Cost at least ($)", { type: "number", step: "any", min: "0", style: "width:110px" }),
    h("label", {}, "Show", h("select", { name: "flag", onchange: (e) => go({ flag: e.target.value }) },
      ...[["", "all runs"], ["stuck", "stuck only"], ["dead_letter", "dead-lettered only"]].map(([v, t]) => h("option", { value: v, selected: filters.flag === v }, t)))),
    h("button", { onclick: () => go(Object.fromEntries(FIELDS.map((f) => [f, ""]))) }, "Clear"));

  mount(main, h("h1", {}, "Runs"), form, counts, errors,
    h("table", { "data-testid": "runs-table" },
      h("thead", {}, h("tr", {}, ...["Run", "Status", "Profile", "User", "Model", "Cost", "Tokens", "Created", "Finished"].map((t) => h("th", {}, t)))),
      table), more);

  const params = () => {
    const p = { ...filters, limit: 50 };
    for (const k of ["since", "until"]) if (p[k]) p[k] = new Date(p[k]).toISOString();
    return p;
  };

  function row(run) {
    const flags = run.flags || [];
    const cls = flags.includes("dead_letter") ? "dead" : flags.includes("stuck") ? "flagged" : "";
    return h("tr", { class: cls, "data-run": run.runId },
      h("td", {}, h("a", { href: `#/runs/${run.runId}`, class: "mono" }, run.runId), run.parentRunId ? h("span", { class: "muted" }, " (child)") : null),
      h("td", {}, statusBadge(run.status), ...flags.map((f) => badge(f === "dead_letter" ? "dead-lettered" : f, `f-${f}`))),
      h("td", {}, `${run.agent.name}@${run.agent.version}`),
      h("td", {}, run.userId),
      h("td", { class: "mono" }, run.model),
      h("td", {}, run.usage && run.usage.cost !== undefined ? money(run.usage.cost) : "–"),
      h("td", {}, run.usage && run.usage.totalTokens ? String(run.usage.totalTokens) : "–"),
      h("td", {}, when(run.createdAt)),
      h("td", {}, when(run.finishedAt)));
  }

  async function load(after = null, append = false) {
    try {
      const page = await api("/api/console/runs" + query({ ...params(), cursor: after }));
      mount(errors);
      const total = Object.values(page.counts).reduce((a, b) => a + b, 0);
      mount(counts,
        h("button", { class: filters.status ? "" : "active", onclick: () => go({ status: "" }) }, "all", h("span", { class: "n" }, total)),
        ...STATUSES.map((s) => h("button", { class: filters.status === s ? "active" : "", "data-status": s, onclick: () => go({ status: s }) }, s.replace("_", " "), h("span", { class: "n" }, page.counts[s]))),
        page.flags.stuck ? h("button", { class: "f-stuck", onclick: () => go({ flag: "stuck" }) }, "stuck", h("span", { class: "n" }, page.flags.stuck)) : null,
        page.flags.deadLetter ? h("button", { class: "f-dead_letter", onclick: () => go({ flag: "dead_letter" }) }, "dead-lettered", h("span", { class: "n" }, page.flags.deadLetter)) : null);
      const rows = page.runs.map(row);
      if (append) table.append(...rows);
      else mount(table, rows.length ? rows : [h("tr", {}, h("td", { colspan: 9, class: "muted" }, "No runs match."))]);
      cursor = page.nextCursor;
      more.hidden = !cursor;
    } catch (err) {
      mount(errors, errorBox(err));
    }
  }

  // Live: refresh the first page and the counts; pages fetched with "More" stay as they are.
  let alive = true;
  const tick = async () => { if (!cursor || table.children.length <= 50) await load(); if (alive) timer = setTimeout(tick, REFRESH_MS); };
  tick();
  return () => { alive = false; clearTimeout(timer); };
}
