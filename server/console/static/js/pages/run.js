// A run: the conversation streamed live beside its timeline and panels; cancel, pause, resume.
import { api, follow } from "../api.js";
import { h, mount, statusBadge, errorBox, when, money } from "../ui.js";
import { Timeline, planPanel, childrenPanel, artifactsPanel, usagePanel, tracePanel, contextPanel } from "./run_panels.js";

const TERMINAL = new Set(["completed", "failed", "cancelled"]);
const STATUS_EVENTS = new Set(["run.started", "run.requeued", "run.completed", "run.failed", "run.cancelled", "run.paused", "run.resumed",
  "tool.started", "tool.completed", "tool.failed", "approval.required", "approval.resolved", "subagent.started", "subagent.completed"]);

/** The conversation as the user saw it: their message, then the assistant's items as streamed. */
class Conversation {
  constructor() {
    this.el = h("div", { class: "conversation panel", "data-testid": "conversation" });
    this.items = new Map();
  }
  user(text) { this.el.prepend(h("div", { class: "msg user", "data-testid": "user-message" }, text)); }
  item(id, text = "", status = "streaming") {
    let node = this.items.get(id);
    if (!node) {
      node = h("div", { class: "msg assistant", "data-item": id, "data-testid": "assistant-item" });
      this.items.set(id, node);
      this.el.append(node);
    }
    node.textContent = text;
    node.classList.toggle("superseded", status === "superseded");
    node.dataset.status = status;
    return node;
  }
  tool(text) { this.el.append(h("div", { class: "msg tool" }, text)); }
  apply(e) {
    const d = e.data;
    if (e.type === "message.item.created") this.item(d.itemId);
    else if (e.type === "message.item.delta") { const n = this.items.get(d.itemId) || this.item(d.itemId); n.textContent += d.delta; }
    else if (e.type === "message.item.completed") this.item(d.itemId, d.text ?? (this.items.get(d.itemId)?.textContent || ""), d.status);
    else if (e.type === "tool.started" && !d.replayed) this.tool(`→ ${d.name}(${JSON.stringify(d.args)})`);
    else if (e.type === "approval.required") this.tool(`⏸ ${d.name} waits for approval: ${d.reason}`);
    else if (e.type === "run.failed") this.el.append(errorBox({ message: `Run failed: ${d.errorType}: ${d.message}` }));
  }
}

export function runPage(main, runId) {
  performance.mark("console:run-start");
  let stop = null;
  let alive = true;
  const header = h("div", { class: "panel", "data-testid": "run-header" });
  const conversation = new Conversation();
  const stream = h("span", { class: "muted", "data-testid": "stream-state" });
  const timeline = new Timeline(runId);
  const panelBody = h("div");
  const tabs = h("div", { class: "tabs" });
  const panels = {
    Timeline: () => timeline.el,
    Plan: () => planPanel(snapshot),
    Children: () => childrenPanel(runId),
    Artifacts: () => artifactsPanel(runId),
    Usage: () => usagePanel(runId),
    Trace: () => tracePanel(runId),
    Context: () => contextPanel(runId),
  };
  let current = "Timeline";
  let snapshot = null;
  let run = null;
  const show = (name) => {
    current = name;
    for (const b of tabs.children) b.classList.toggle("active", b.textContent === name);
    mount(panelBody, panels[name]());
  };
  for (const name of Object.keys(panels)) tabs.append(h("button", { "data-tab": name, onclick: () => show(name) }, name));

  mount(main, header, h("div", { class: "run-grid" },
    h("section", {}, h("h2", {}, "Conversation ", stream), conversation.el),
    h("section", {}, tabs, panelBody)));

  const act = (label, path, cls = "") => h("button", { class: cls, "data-action": label.toLowerCase(), onclick: async (e) => {
    e.target.disabled = true;
    try { await api(`/api/runs/${runId}/${path}`, { method: "POST" }); await refresh(); }
    catch (err) { header.append(errorBox(err)); e.target.disabled = false; }
  } }, label);

  function drawHeader() {
    const u = run.usage || {};
    const actions = [];
    if (!TERMINAL.has(run.status)) actions.push(act("Cancel", "cancel", "danger"));
    if (run.status === "paused") actions.push(act("Resume", "resume", "primary"));
    else if (!TERMINAL.has(run.status) && !run.pauseRequested) actions.push(act("Pause", "pause"));
    mount(header,
      h("h1", {}, "Run ", h("span", { class: "mono" }, run.runId), " ", h("span", { "data-testid": "run-status" }, statusBadge(run.status))),
      h("dl", { class: "kv" },
        h("dt", {}, "Profile"), h("dd", {}, `${run.agent.name}@${run.agent.version}`),
        h("dt", {}, "Model"), h("dd", { class: "mono" }, run.model),
        h("dt", {}, "User"), h("dd", {}, run.userId),
        h("dt", {}, "Conversation"), h("dd", { class: "mono" }, run.conversationId),
        run.parentRunId ? [h("dt", {}, "Parent"), h("dd", {}, h("a", { href: `#/runs/${run.parentRunId}`, class: "mono" }, run.parentRunId))] : null,
        h("dt", {}, "Created"), h("dd", {}, when(run.createdAt)),
        h("dt", {}, "Finished"), h("dd", {}, when(run.finishedAt)),
        h("dt", {}, "Cost"), h("dd", {}, h("span", { "data-testid": "run-cost" }, u.cost !== undefined ? money(u.cost) : "–"),
          u.unpricedCalls ? h("span", { class: "muted" }, ` + ${u.unpricedCalls} model call(s) without a known price`) : null),
        h("dt", {}, "Tokens"), h("dd", {}, u.totalTokens ?? "–"),
        run.error ? [h("dt", {}, "Error"), h("dd", { class: "k-error", "data-testid": "run-error" }, `${run.error.type}: ${run.error.message}`)] : null),
      h("div", { class: "actions" }, actions));
  }

  // One record fetch at a time; a change seen meanwhile fetches once more after it, so the
  // header never settles on a record older than the last event.
  let refreshing = null;
  let again = false;
  async function refresh() {
    if (refreshing) { again = true; return refreshing; }
    refreshing = (async () => {
      do {
        again = false;
        run = await api(`/api/runs/${runId}`);
        if (alive) drawHeader();
      } while (again && alive);
    })().finally(() => { refreshing = null; });
    return refreshing;
  }

  (async () => {
    const firstPage = timeline.page(0, 1000);
    firstPage.catch(() => {});
    try {
      [run, snapshot] = await Promise.all([api(`/api/runs/${runId}`), api(`/api/runs/${runId}/snapshot`)]);
    } catch (err) { mount(main, errorBox(err)); return; }
    drawHeader();
    for (const item of snapshot.items || []) if (item.role !== "user") conversation.item(item.itemId, item.text, item.status);
    if (snapshot.error) conversation.el.append(errorBox({ message: `Run failed: ${snapshot.error.type || snapshot.error.errorType}: ${snapshot.error.message}` }));
    api(`/api/conversations/${run.conversationId}/messages`).then((m) => {
      const input = (m.messages || []).find((x) => x.messageId === run.inputMessageId);
      if (input) conversation.user(input.content);
    }).catch(() => {});
    show(current);
    // The snapshot first, then the log: the first page of events draws before the rest loads.
    await timeline.start(firstPage);
    performance.mark("console:run-rendered");
    performance.measure("console:run-first-render", "console:run-start", "console:run-rendered");
    document.body.dataset.runRendered = "1";
    if (!alive) return;
    if (TERMINAL.has(snapshot.status)) {
      // The record and the snapshot were read side by side: a run that ended between the two
      // reads has a record older than its end, so the header reads it again.
      if (run.status !== snapshot.status) refresh();
      stream.textContent = "(finished)";
      return;
    }
    stop = follow(runId, snapshot.lastEventId, (e) => {
      conversation.apply(e);
      timeline.live(e);
      if (e.type === "plan.updated") snapshot.plan = e.data.plan;
      if (STATUS_EVENTS.has(e.type) || e.type === "usage") refresh();
    }, { onState: (s, err) => { stream.textContent = `(${s})`; stream.dataset.state = s; if (err) conversation.el.append(errorBox(err)); } });
  })();

  return () => { alive = false; timeline.stop(); if (stop) stop(); };
}
