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
 * Rows are a fixed `rowHeight` pixels; `create()` makes an empty row and `fill(row, item)`
 * writes an item into it, so rows scrolled out are reused instead of rebuilt.
 */
export class VirtualList {
  constructor({ rowHeight = 24, height = 420, create, fill, onSelect }) {
    this.items = [];
    this.rowHeight = rowHeight;
    this.create = create;
    this.fill = fill;
    this.spacer = h("div", { class: "spacer" });
    this.el = h("div", { class: "vlist", style: `height:${height}px`, "data-testid": "event-list" }, this.spacer);
    this.el.addEventListener("scroll", () => this.schedule());
    this.spacer.addEventListener("click", (e) => {
      const row = e.target.closest(".row");
      if (row && onSelect) onSelect(this.items[Number(row.dataset.index)]);
    });
    this.pending = false;
    this.shown = new Map();
    this.spare = [];
  }
  setItems(items) { this.items = items; for (const r of this.shown.values()) this.spare.push(r); this.shown.clear(); this.schedule(); }
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
    const top = this.el.scrollTop, height = this.el.clientHeight || 420;
    const first = Math.max(0, Math.floor(top / this.rowHeight) - 10);
    const last = Math.min(this.items.length, Math.ceil((top + height) / this.rowHeight) + 10);
    for (const [i, row] of this.shown) if (i < first || i >= last) { this.shown.delete(i); this.spare.push(row); }
    for (let i = first; i < last; i++) {
      if (this.shown.has(i)) continue;
      let row = this.spare.pop();
      if (!row) { row = this.create(); row.classList.add("row"); this.spacer.append(row); }
      row.dataset.index = i;
      row.style.transform = `translateY(${i * this.rowHeight}px)`;
      this.fill(row, this.items[i]);
      this.shown.set(i, row);
    }
    for (const row of this.spare) row.style.transform = "translateY(-1000px)";
  }
}

/** A horizontal bar chart: one bar per {label, value, text}; clicking a bar calls onPick(item). */
export function barChart(items, { title, onPick, testid }) {
  const rowH = 22, labelW = 150, width = 600, barW = width - labelW - 200;
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
