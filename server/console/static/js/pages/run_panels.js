// The panels of a run page: timeline, plan, children, artifacts, usage, trace, context manifests.
import { api, apiKey } from "../api.js";
import { h, svg, mount, statusBadge, errorBox, when, money, num, json, short, VirtualList } from "../ui.js";

// A small first page draws the list at once; the rest come in larger pages behind it.
const FIRST_PAGE = 1000;
const PAGE = 10000;
const BUCKETS = 120;

function kind(type) {
  if (type.startsWith("tool.")) return "tool";
  if (type.startsWith("approval.")) return "approval";
  if (type === "run.failed" || type === "model.retry" || type === "tool.retrying") return "error";
  if (type.startsWith("plan.") || type.startsWith("subagent.") || type.startsWith("artifact.")) return "plan";
  if (type.startsWith("run.") || type === "usage" || type === "context.built" || type.startsWith("model.")) return "run";
  return "msg";
}

/** What a row of the timeline says about an event. */
function summary(e) {
  const d = e.data || {};
  switch (e.type) {
    case "message.item.delta": return short(d.delta, 200);
    case "message.item.completed": return `${d.status}: ${short(d.text, 160)}`;
    case "tool.started": return `${d.name}(${short(d.args, 160)}) risk ${d.risk}${d.replayed ? " (replayed)" : ""}`;
    case "tool.completed": return `${d.name} → ${short(d.output, 160)} in ${d.durationMs} ms`;
    case "tool.failed": return `${d.name} failed: ${d.errorType}: ${short(d.error, 140)}`;
    case "tool.retrying": return `${d.name} attempt ${d.attempt} after ${d.errorType}`;
    case "approval.required": return `${d.name}(${short(d.args, 120)}): ${d.reason}`;
    case "approval.resolved": return `${d.name} ${d.status} by ${d.by}${d.reason ? ": " + d.reason : ""}`;
    case "usage": return d.call ? `${d.call.modelId} ${d.call.totalTokens ?? "?"} tokens, ${money(d.call.cost)}` : "";
    case "plan.updated": return `revision ${d.plan?.revision}: ${(d.plan?.steps || []).map((s) => `${s.title} [${s.status}]`).join(", ")}`;
    case "subagent.started": return `${d.agent}: ${short(d.task, 140)}`;
    case "subagent.completed": return `${d.agent} ${d.status}`;
    case "artifact.created": case "artifact.updated": return `${d.name} v${d.version} (${num(d.size)} bytes)`;
    case "run.failed": return `${d.errorType}: ${d.message}`;
    case "context.built": return `step ${d.step}: ${d.totalTokens} tokens to ${d.model}`;
    default: return short(d, 200);
  }
}

/** The run's events on a time axis (a histogram per kind) above a virtualised list of them all. */
export class Timeline {
  constructor(runId) {
    this.runId = runId;
    this.events = [];
    this.last = 0;
    this.stopped = false;
    this.detail = h("pre", { class: "detail", "data-testid": "event-detail", hidden: true });
    this.axis = h("div", { "data-testid": "time-axis" });
    this.count = h("span", { class: "muted", "data-testid": "event-count" });
    this.list = new VirtualList({
      create: () => h("div", {}, h("span", { class: "seq" }), h("span", { class: "t" }), h("span", { class: "type" }), h("span")),
      fill: (row, e) => {
        const [seq, t, type, text] = row.children;
        row.dataset.seq = e.seq;
        seq.textContent = e.seq;
        t.textContent = this.t0 ? `+${((Date.parse(e.ts) - this.t0) / 1000).toFixed(2)}s` : "";
        type.textContent = e.type;
        type.className = `type k-${kind(e.type)}`;
        text.textContent = summary(e);
      },
      onSelect: (e) => { this.detail.hidden = false; this.detail.textContent = json(e); },
    });
    this.list.follow = true;
    this.el = h("div", { class: "panel" }, h("div", {}, "Events ", this.count), this.axis, this.list.el, this.detail);
  }
  async page(after, limit = PAGE) {
    return api(`/api/console/runs/${this.runId}/events?after=${after}&limit=${limit}`);
  }
  add(fresh) {
    const events = fresh.filter((e) => e.seq > this.last);
    if (!events.length) return;
    if (!this.t0) this.t0 = Date.parse(events[0].ts);
    for (const e of events) this.events.push(e);
    this.last = events[events.length - 1].seq;
    this.list.append(events);
    this.count.textContent = `(${num(this.events.length)})`;
  }
  /** Load the first page (awaited: the page's first render) and the rest in the background. */
  async start(firstPage = this.page(0, FIRST_PAGE)) {
    const first = await firstPage;
    this.add(first.events);
    this.drawAxis();
    this.rest(first.nextAfter);
  }
  async rest(after) {
    // One reader of the log at a time; live events that arrive meanwhile are read by it.
    if (this.loading) return;
    this.loading = true;
    try {
      while (after !== null && !this.stopped) {
        const next = await this.page(after);
        this.add(next.events);
        after = next.nextAfter;
      }
    } finally { this.loading = false; }
    if (this.behind > this.last && !this.stopped) return this.rest(this.last);
    this.drawAxis();
    performance.mark("console:events-loaded");
    this.el.dataset.loaded = "1";
  }
  live(e) {
    if (e.seq <= this.last) return;
    if (this.loading) { this.behind = Math.max(this.behind || 0, e.seq); return; }
    if (e.seq === this.last + 1) { this.add([e]); this.drawAxisSoon(); }
    else this.rest(this.last);
  }
  drawAxisSoon() { clearTimeout(this.axisTimer); this.axisTimer = setTimeout(() => this.drawAxis(), 500); }
  drawAxis() {
    if (!this.events.length) return mount(this.axis, h("p", { class: "muted" }, "No events."));
    const t0 = Date.parse(this.events[0].ts), t1 = Date.parse(this.events[this.events.length - 1].ts);
    const span = Math.max(1, t1 - t0), width = 760, height = 60;
    const kinds = ["msg", "run", "tool", "approval", "plan", "error"];
    const colors = { msg: "#9aa5b1", run: "#2457c5", tool: "#6a1b9a", approval: "#b26a00", plan: "#00796b", error: "#c62828" };
    const bins = kinds.map(() => new Array(BUCKETS).fill(0));
    for (const e of this.events) {
      const b = Math.min(BUCKETS - 1, Math.floor(((Date.parse(e.ts) - t0) / span) * BUCKETS));
      bins[kinds.indexOf(kind(e.type))][b] += 1;
    }
    const max = Math.max(1, ...bins[0].map((_, i) => kinds.reduce((a, _k, k) => a + bins[k][i], 0)));
    const chart = svg("svg", { width, height: height + 16, role: "img", "aria-label": "events over time" });
    const bw = width / BUCKETS;
    for (let i = 0; i < BUCKETS; i++) {
      let y = height;
      kinds.forEach((k, n) => {
        const v = bins[n][i];
        if (!v) return;
        const bh = Math.max(1, (v / max) * height);
        y -= bh;
        chart.append(svg("rect", { x: i * bw, y, width: Math.max(1, bw - 1), height: bh, fill: colors[k] }, svg("title", {}, `${v} ${k} events`)));
      });
    }
    chart.append(svg("text", { x: 0, y: height + 13 }, "0 s"), svg("text", { x: width - 60, y: height + 13 }, `${(span / 1000).toFixed(1)} s`));
    mount(this.axis, chart, h("div", { class: "muted" }, ...kinds.map((k) => h("span", { style: `color:${colors[k]};margin-right:10px` }, "■ " + k))));
  }
  stop() { this.stopped = true; }
}

function loading(load) {
  const box = h("div", { class: "panel" }, h("p", { class: "muted" }, "Loading…"));
  load().then((content) => mount(box, content)).catch((err) => mount(box, errorBox(err)));
  return box;
}

export function planPanel(snapshot) {
  const plan = snapshot && snapshot.plan;
  if (!plan) return h("div", { class: "panel muted" }, "This run has no plan.");
  const ex = snapshot.execution;
  return h("div", { class: "panel", "data-testid": "plan" },
    ex ? h("p", {}, h("strong", {}, "Now: "), ex.text) : null,
    h("ol", {}, ...plan.steps.map((s) => h("li", {}, statusBadge(s.status), " ", s.title, s.notes ? h("div", { class: "muted" }, s.notes) : null))),
    h("p", { class: "muted" }, `revision ${plan.revision}`));
}

export function childrenPanel(runId) {
  const node = (child) => {
    const sub = h("ul");
    let open = false;
    const toggle = h("button", { onclick: async () => {
      open = !open;
      toggle.textContent = open ? "−" : "+";
      if (!open) return mount(sub);
      try { const c = await api(`/api/runs/${child.runId}/children`); mount(sub, c.children.map(node)); }
      catch (err) { mount(sub, errorBox(err)); }
    } }, "+");
    const retry = h("button", { "data-action": "retry", onclick: async () => {
      try { await api(`/api/runs/${child.runId}/retry`, { method: "POST" }); retry.textContent = "retried"; }
      catch (err) { retry.after(errorBox(err)); }
    } }, "Retry");
    return h("li", { "data-child": child.runId }, toggle, " ", h("a", { href: `#/runs/${child.runId}`, class: "mono" }, child.runId), " ",
      statusBadge(child.status), " ", child.agent || "", child.current === false ? h("span", { class: "muted" }, " (retried)") : null,
      " ", h("span", { class: "muted" }, short(child.task || "", 80)), " ", retry, sub);
  };
  return loading(async () => {
    const c = await api(`/api/runs/${runId}/children`);
    return c.children.length ? h("div", { class: "tree" }, h("ul", {}, c.children.map(node))) : h("p", { class: "muted" }, "No child runs.");
  });
}

async function download(a) {
  const response = await fetch(`/api/artifacts/${a.artifactId}/content`, { headers: { Authorization: `Bearer ${apiKey()}` } });
  if (!response.ok) throw new Error(`download failed: ${response.status}`);
  const url = URL.createObjectURL(await response.blob());
  const link = h("a", { href: url, download: a.name });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

export function artifactsPanel(runId) {
  return loading(async () => {
    const list = await api(`/api/runs/${runId}/artifacts`);
    const rows = list.artifacts || [];
    if (!rows.length) return h("p", { class: "muted" }, "No artifacts.");
    return h("table", {}, h("tr", {}, ...["Name", "Version", "Type", "Size", ""].map((t) => h("th", {}, t))),
      ...rows.map((a) => h("tr", {}, h("td", {}, a.name), h("td", {}, a.version ?? a.latestVersion ?? ""), h("td", {}, a.mediaType), h("td", {}, num(a.size)),
        h("td", {}, h("button", { onclick: (e) => download(a).catch((err) => e.target.after(errorBox(err))) }, "Download")))));
  });
}

export function usagePanel(runId) {
  return loading(async () => {
    const u = await api(`/api/runs/${runId}/usage`);
    const t = u.totals || {};
    return h("div", { "data-testid": "usage" },
      h("p", {}, "Total ", h("strong", { "data-testid": "usage-cost" }, money(t.cost)), ` · ${num(t.totalTokens)} tokens · ${num(t.modelCalls)} model calls`),
      h("table", {}, h("tr", {}, ...["Step", "Attempt", "Model", "Status", "Input", "Output", "Latency", "Cost"].map((x) => h("th", {}, x))),
        ...u.calls.map((c) => h("tr", {}, h("td", {}, c.step), h("td", {}, c.attempt), h("td", { class: "mono" }, c.modelId), h("td", {}, c.status),
          h("td", {}, num(c.inputTokens)), h("td", {}, num(c.outputTokens)), h("td", {}, `${Math.round(c.latencyMs)} ms`), h("td", {}, money(c.cost))))));
  });
}

export function tracePanel(runId) {
  return loading(async () => {
    const trace = await api(`/api/runs/${runId}/trace`);
    const t0 = Date.parse(trace.root.start);
    const total = Math.max(1, trace.root.durationMs);
    const failing = trace.failedSpan && trace.failedSpan.spanId;
    const rows = [];
    const walk = (span, depth) => {
      const left = ((Date.parse(span.start) - t0) / total) * 100;
      const width = Math.max(0.5, (span.durationMs / total) * 100);
      const cls = `span${span.status === "error" ? " error" : ""}${span.spanId === failing ? " failing" : ""}`;
      rows.push(h("div", { class: cls, "data-span": span.spanId, "data-testid": span.spanId === failing ? "failing-span" : null, title: span.error || "" },
        h("span", { style: `padding-left:${depth * 14}px` }, span.name, span.error ? h("span", { class: "k-error" }, ` — ${short(span.error, 60)}`) : null),
        h("div", {}, h("div", { class: "bar", style: `margin-left:${left}%;width:${Math.min(width, 100 - left)}%` })),
        h("span", { class: "muted" }, `${span.durationMs.toFixed(1)} ms`)));
      for (const c of span.children) walk(c, depth + 1);
    };
    walk(trace.root, 0);
    return h("div", { class: "waterfall", "data-testid": "trace" },
      trace.failedSpan ? h("p", { class: "k-error" }, `Failed at ${trace.failedSpan.name}: ${trace.failedSpan.error}`) : null,
      h("p", { class: "muted" }, `${trace.spanCount} spans · trace ${trace.traceId}`), rows);
  });
}

export function contextPanel(runId) {
  return loading(async () => {
    const c = await api(`/api/runs/${runId}/context`);
    if (!c.manifests.length) return h("p", { class: "muted" }, "No model call yet.");
    return h("div", {}, ...c.manifests.map((m) => h("details", { class: "panel" },
      h("summary", {}, `Step ${m.step}, attempt ${m.attempt}: ${m.model}, ${num(m.totalTokens)} of ${num(m.window)} tokens`),
      h("table", {}, h("tr", {}, ...["Section", "Kind", "Tokens", "Budget", "Items"].map((x) => h("th", {}, x))),
        ...(m.sections || []).map((s) => h("tr", {}, h("td", {}, s.name), h("td", {}, s.kind || ""), h("td", {}, num(s.tokens)),
          h("td", {}, s.budget == null ? "–" : num(s.budget)), h("td", {}, typeof s.items === "number" ? num(s.items) : short(s.items, 60))))),
      ["dropped", "cut", "deduplicated"].map((k) => (m[k] && m[k].length ? h("p", {}, h("strong", {}, k + ": "), short(m[k], 400)) : null)),
      h("pre", { class: "detail" }, json(m)))));
  });
}
