// Usage: cost and tokens per day, model, user and profile; each bar opens the runs behind it.
import { api, query } from "../api.js";
import { h, mount, errorBox, barChart, num } from "../ui.js";

const DIMENSIONS = [["day", "per day"], ["model", "per model"], ["user", "per user"], ["agent", "per profile"]];

export function usagePage(main, q) {
  const days = Number(q.get("days") || 30);
  const metric = q.get("metric") || "cost";
  const until = new Date();
  const since = new Date(until.getTime() - days * 86400000);
  const charts = h("div", { class: "charts" });
  const scope = h("p", { class: "muted" });
  const go = (changes) => { location.hash = "#/usage" + query({ days, metric, ...changes }); };
  mount(main, h("h1", {}, "Usage"),
    h("div", { class: "filters panel" },
      h("label", {}, "Period", h("select", { onchange: (e) => go({ days: e.target.value }) },
        ...[1, 7, 30, 90, 365].map((d) => h("option", { value: d, selected: d === days }, `last ${d} days`)))),
      h("label", {}, "Measure", h("select", { onchange: (e) => go({ metric: e.target.value }) },
        ...[["cost", "cost"], ["totalTokens", "tokens"], ["modelCalls", "model calls"]].map(([v, t]) => h("option", { value: v, selected: v === metric }, t))))),
    scope, charts);

  // The run list's time filters are local times (datetime-local fields); usage days are UTC.
  const local = (ms) => { const d = new Date(ms - new Date(ms).getTimezoneOffset() * 60000); return d.toISOString().slice(0, 16); };
  const runsFor = (by, key) => {
    if (by === "day") {
      const start = Date.parse(`${key}T00:00:00Z`);
      return "#/runs" + query({ since: local(start), until: local(start + 86400000) });
    }
    return "#/runs" + query({ [by]: key, since: local(since.getTime()) });
  };

  (async () => {
    try {
      const results = await Promise.all(DIMENSIONS.map(([by]) => api("/api/console/usage" + query({ by, since: since.toISOString(), until: until.toISOString() }))));
      scope.textContent = results[0].scope === "tenant" ? "The whole tenant." : "Your own usage (the billing role sees the whole tenant).";
      mount(charts, results.map((r, i) => barChart(
        r.groups.map((g) => ({ label: g.key, value: Number(g[metric]), text: metric === "cost" ? `$${g.cost} · ${num(g.totalTokens)} tok${g.unpricedCalls ? ` · ${g.unpricedCalls} unpriced` : ""}` : num(g[metric]) })),
        { title: `${metric === "cost" ? "Cost" : metric === "totalTokens" ? "Tokens" : "Model calls"} ${DIMENSIONS[i][1]}`, testid: `chart-${r.by}`,
          onPick: (item) => { location.hash = runsFor(r.by, item.label); } })));
    } catch (err) { mount(charts, errorBox(err)); }
  })();
  return () => {};
}
