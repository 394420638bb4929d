// Approvals: the reviewer's queue across runs; approve, reject with a reason, or edit the arguments.
import { api } from "../api.js";
import { validate } from "../schema.js";
import { h, mount, badge, errorBox, when, json } from "../ui.js";

// Every open console polls, so a decision made anywhere leaves all queues within this time.
const REFRESH_MS = 1000;

export function approvalsPage(main) {
  const list = h("div", { class: "cards", "data-testid": "approval-queue" });
  const errors = h("div");
  const cards = new Map();
  let schemas = {};
  let timer = null;
  mount(main, h("h1", {}, "Approvals"), h("p", { class: "muted" }, "Tool calls waiting for a reviewer, oldest first."), errors, list);

  function card(a) {
    const args = h("textarea", { rows: 5, name: "args", "aria-label": "arguments" }, json(a.args));
    const reason = h("input", { name: "reason", placeholder: "reason (required to reject)", style: "flex:1" });
    const problems = h("div");
    const decide = async (decision) => {
      mount(problems);
      const body = { decision };
      if (reason.value.trim()) body.reason = reason.value.trim();
      if (decision === "reject" && !body.reason) return mount(problems, errorBox({ message: "Say why you reject it: the model reads the reason." }));
      if (decision === "edit") {
        let edited;
        try { edited = JSON.parse(args.value); } catch (err) { return mount(problems, errorBox({ message: `The arguments are not valid JSON: ${err.message}` })); }
        const found = validate(edited, schemas[a.tool]);
        if (found.length) return mount(problems, errorBox({ message: found.join("; ") }));
        body.args = edited;
      }
      try {
        await api(`/api/approvals/${a.approvalId}`, { method: "POST", body });
        el.remove(); cards.delete(a.approvalId);
      } catch (err) { mount(problems, errorBox(err)); }
    };
    const el = h("div", { class: "card", "data-approval": a.approvalId, "data-testid": "approval" },
      h("div", {}, h("strong", {}, a.tool), " ", badge(`risk ${a.risk}`, a.risk === "high" ? "s-failed" : ""), " ", a.kind === "in_doubt" ? badge("in doubt", "s-waiting_user") : null),
      h("div", { class: "muted" }, a.reason),
      h("div", { class: "muted" }, "run ", h("a", { href: `#/runs/${a.runId}`, class: "mono" }, a.runId), ` · asked ${when(a.requestedAt)}`, a.expiresAt ? ` · expires ${when(a.expiresAt)}` : ""),
      args,
      h("div", { class: "row" }, reason),
      h("div", { class: "row" },
        h("button", { class: "primary", "data-action": "approve", onclick: () => decide("approve") }, "Approve"),
        h("button", { "data-action": "edit", onclick: () => decide("edit") }, "Approve with edited arguments"),
        h("button", { class: "danger", "data-action": "reject", onclick: () => decide("reject") }, "Reject")),
      problems);
    return el;
  }

  async function load() {
    try {
      const [pending, tools] = await Promise.all([api("/api/approvals?status=pending&limit=100"), Object.keys(schemas).length ? null : api("/api/tools")]);
      if (tools) schemas = Object.fromEntries(tools.tools.map((t) => [t.name, t.inputSchema]));
      mount(errors);
      const ids = new Set(pending.approvals.map((a) => a.approvalId));
      for (const [id, el] of cards) if (!ids.has(id)) { el.remove(); cards.delete(id); }
      for (const a of pending.approvals) if (!cards.has(a.approvalId)) { const el = card(a); cards.set(a.approvalId, el); list.append(el); }
      list.dataset.count = String(cards.size);
      if (!cards.size && !list.querySelector(".empty")) list.append(h("p", { class: "muted empty" }, "Nothing waits for a decision."));
      if (cards.size) list.querySelector(".empty")?.remove();
    } catch (err) { mount(errors, errorBox(err)); }
  }
  let alive = true;
  const tick = async () => { await load(); if (alive) timer = setTimeout(tick, REFRESH_MS); };
  tick();
  return () => { alive = false; clearTimeout(timer); };
}
