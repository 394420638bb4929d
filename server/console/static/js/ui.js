// Small DOM helpers, formatting, a virtualised list and SVG bar charts: no library needed.

/** Create an element: h("td", {class: "x", onclick: f}, child, "text"). */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined && c !== false) el.append(c instanceof Node ? c : String(c));
  return el;
}

export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) el.setAttribute(k, v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : String(c));
  return el;
}

export function badge(text, cls = "") { return h("span", { class: `badge ${cls}` }, text); }
export function statusBadge(status) { return badge(status, `s-${status}`); }
export function errorBox(err) { return h("div", { class: "error-box", role: "alert" }, err && err.message ? err.message : String(err)); }

export function when(iso) { return iso ? new Date(iso).toLocaleString() : "–"; }
export function money(v) { return v === null || v === undefined ? "unknown" : `$${v}`; }
export function num(v) { return v === null || v === undefined ? "–" : Number(v).toLocaleString("en-US"); }
export function json(v) { return JSON.stringify(v, null, 2); }
export function short(v, n = 120) { const s = typeof v === "string" ? v : JSON.stringify(v); return s && s.length > n ? s.slice(0, n) + "…" : s || ""; }

/** Replace the children of `el`. */
export function mount(el, ...children) { el.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined)); return el; }

/**
 * A list that only puts the visible rows in the DOM, so 100,000 rows scroll like 50.
 * `render(item, index)` returns a row element; rows are a fixed `rowHeight` pixels.
 */
export class VirtualList {
  constructor({ rowHeight = 24, height = 420, render, onSelect }) {
    this.items = [];
    this.rowHeight = rowHeight;
    this.render = render;
    this.onSelect = onSelect;
    this.spacer = h("div", { class: "spacer" });
    this.el = h("div", { class: "vlist", style: `height:${height}px`, "data-testid": "event-list" }, this.spacer);
    this.el.addEventListener("scroll", () => this.schedule());
    this.pending = false;
    this.shown = new Map();
  }
  setItems(items) { this.items = items; this.shown.forEach((r) => r.remove()); this.shown.clear(); this.schedule(); }
  append(items) {
    const stick = this.el.scrollTop + this.el.clientHeight >= this.spacer.offsetHeight - this.rowHeight;
    for (const i of items) this.items.push(i);
    this.schedule();
    if (stick && this.follow) requestAnimationFrame(() => { this.el.scrollTop = this.spacer.offsetHeight; });
  }
  schedule() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; this.draw(); });
  }
  draw() {
    this.spacer.style.height = `${this.items.length * this.rowHeight}px`;
    const first = Math.max(0, Math.floor(this.el.scrollTop / this.rowHeight) - 10);
    const last = Math.min(this.items.length, Math.ceil((this.el.scrollTop + (this.el.clientHeight || 420)) / this.rowHeight) + 10);
    for (const [i, row] of this.shown) if (i < first || i >= last) { row.remove(); this.shown.delete(i); }
    for (let i = first; i < last; i++) {
      if (this.shown.has(i)) continue;
      const row = this.render(this.items[i], i);
      row.classList.add("row");
      row.style.top = `${i * this.rowHeight}px`;
      row.addEventListener("click", () => this.onSelect && this.onSelect(this.items[i], i));
      this.spacer.append(row);
      this.shown.set(i, row);
    }
  }
}

/** A horizontal bar chart: one bar per {label, value, text}; clicking a bar calls onPick(item). */
export function barChart(items, { title, onPick, testid }) {
  const rowH = 22, labelW = 150, width = 440, barW = width - labelW - 90;
  const max = Math.max(0, ...items.map((i) => i.value)) || 1;
  const chart = svg("svg", { width, height: Math.max(rowH, items.length * rowH) + 4, role: "img", "aria-label": title, "data-testid": testid });
  items.forEach((item, n) => {
    const y = n * rowH + 2;
    const w = Math.max(1, (item.value / max) * barW);
    chart.append(
      svg("text", { x: 0, y: y + 14 }, short(item.label, 22)),
      svg("rect", { class: "barrect", x: labelW, y, width: w, height: rowH - 6, "data-key": item.label, onclick: () => onPick && onPick(item) }, svg("title", {}, `${item.label}: ${item.text}`)),
      svg("text", { x: labelW + w + 4, y: y + 14 }, item.text),
    );
  });
  return h("div", { class: "panel" }, h("h2", {}, title), items.length ? chart : h("p", { class: "muted" }, "Nothing in this period."));
}
