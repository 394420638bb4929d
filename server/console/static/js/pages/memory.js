// Memory and knowledge: browse and search a user's memories, delete one; knowledge bases,
// their documents and ingestion status, and what retrieval would return for a query.
import { api, query } from "../api.js";
import { h, mount, errorBox, when, num, short } from "../ui.js";

export function memoryPage(main, q) {
  const user = h("input", { name: "userId", placeholder: "user id (yours if empty)", value: q.get("user") || "" });
  const text = h("input", { name: "q", placeholder: "search memories", value: q.get("q") || "", style: "width:260px" });
  const memories = h("div", { "data-testid": "memories" });
  const kbs = h("div", { "data-testid": "knowledge-bases" });
  const kbBody = h("div");

  async function loadMemories() {
    try {
      const r = await api("/api/memories" + query({ userId: user.value.trim(), q: text.value.trim(), limit: 100 }));
      if (!r.memories.length) return mount(memories, h("p", { class: "muted" }, "No memories."));
      mount(memories, h("table", {}, h("tr", {}, ...["Memory", "Kind", "Scope", "User", "Similarity", "Updated", ""].map((t) => h("th", {}, t))),
        ...r.memories.map((m) => h("tr", { "data-memory": m.id }, h("td", {}, m.text), h("td", {}, m.kind), h("td", {}, m.scope), h("td", {}, m.userId || "–"),
          h("td", {}, m.similarity == null ? "" : m.similarity.toFixed(3)), h("td", {}, when(m.updatedAt)),
          h("td", {}, h("button", { class: "danger", onclick: async (e) => {
            if (!confirm(`Delete this memory?\n\n${m.text}`)) return;
            try { await api(`/api/memories/${m.id}`, { method: "DELETE" }); loadMemories(); } catch (err) { e.target.after(errorBox(err)); }
          } }, "Delete"))))));
    } catch (err) { mount(memories, errorBox(err)); }
  }

  async function openKb(kb) {
    const search = h("input", { placeholder: "what would retrieval return for…", style: "width:340px" });
    const results = h("div", { "data-testid": "kb-results" });
    const docs = h("div");
    mount(kbBody, h("div", { class: "panel" }, h("h2", {}, kb.name), h("p", { class: "muted" }, kb.description || ""),
      h("form", { onsubmit: async (e) => {
        e.preventDefault();
        try {
          const r = await api(`/api/knowledge-bases/${kb.id}/search`, { method: "POST", body: { query: search.value, topK: 5 } });
          mount(results, r.results.length ? h("ol", {}, ...r.results.map((c) => h("li", {}, h("strong", {}, c.title || c.documentTitle || c.documentId || ""), ` score ${Number(c.score ?? 0).toFixed(3)}`, h("div", { class: "muted" }, short(c.text || c.content || "", 300))))) : h("p", { class: "muted" }, "Nothing found."));
        } catch (err) { mount(results, errorBox(err)); }
      } }, search, " ", h("button", { type: "submit" }, "Search")), results, h("h2", {}, "Documents"), docs));
    try {
      const d = await api(`/api/knowledge-bases/${kb.id}/documents`);
      mount(docs, d.documents.length ? h("table", {}, h("tr", {}, ...["Title", "Status", "Progress", "Error"].map((t) => h("th", {}, t))),
        ...d.documents.map((x) => h("tr", {}, h("td", {}, x.title), h("td", {}, x.status), h("td", { class: "mono" }, short(x.progress, 80)), h("td", { class: "k-error" }, x.error || "")))) : h("p", { class: "muted" }, "No documents."));
    } catch (err) { mount(docs, errorBox(err)); }
  }

  async function loadKbs() {
    try {
      const r = await api("/api/knowledge-bases");
      mount(kbs, r.knowledgeBases.length ? h("table", {}, h("tr", {}, ...["Name", "Documents", "Chunks", "Embedding", ""].map((t) => h("th", {}, t))),
        ...r.knowledgeBases.map((kb) => h("tr", {}, h("td", {}, kb.name), h("td", {}, num(kb.documents)), h("td", {}, num(kb.chunks)), h("td", { class: "mono" }, kb.embeddingModel),
          h("td", {}, h("button", { onclick: () => openKb(kb) }, "Open"))))) : h("p", { class: "muted" }, "No knowledge bases."));
    } catch (err) { mount(kbs, errorBox(err)); }
  }

  mount(main, h("h1", {}, "Memory and knowledge"),
    h("div", { class: "panel" }, h("h2", {}, "Memories"),
      h("form", { class: "filters", onsubmit: (e) => { e.preventDefault(); loadMemories(); } }, user, text, h("button", { type: "submit" }, "Search")),
      memories),
    h("div", { class: "panel" }, h("h2", {}, "Knowledge bases"), kbs), kbBody);
  loadMemories();
  loadKbs();
  return () => {};
}
