// The console's entry: sign-in, the hash router and the pages.
import { apiKey, signIn, signOut } from "./api.js";
import { h, mount, errorBox } from "./ui.js";
import { runsPage } from "./pages/runs.js";
import { runPage } from "./pages/run.js";
import { approvalsPage } from "./pages/approvals.js";
import { usagePage } from "./pages/usage.js";
import { memoryPage } from "./pages/memory.js";
import { opsPage } from "./pages/ops.js";

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const who = document.getElementById("who");
const out = document.getElementById("sign-out");
let leave = null;

const routes = [
  [/^\/runs\/([^/?]+)$/, (m, q) => runPage(main, decodeURIComponent(m[1]), q)],
  [/^\/runs$/, (m, q) => runsPage(main, q)],
  [/^\/approvals$/, (m, q) => approvalsPage(main, q)],
  [/^\/usage$/, (m, q) => usagePage(main, q)],
  [/^\/memory$/, (m, q) => memoryPage(main, q)],
  [/^\/ops$/, (m, q) => opsPage(main, q)],
];

function signInForm(message) {
  nav.hidden = true; out.hidden = true; who.textContent = "";
  const input = h("input", { type: "password", name: "apiKey", placeholder: "ak_…", autocomplete: "off", "aria-label": "API key" });
  const form = h("form", { class: "panel signin", onsubmit: async (e) => {
    e.preventDefault();
    signIn(input.value.trim());
    route();
  } },
    h("h1", {}, "Sign in"),
    h("p", { class: "muted" }, "Paste an API key (create one with 'agentrt keys create'). It is kept in this tab only."),
    message ? errorBox(message) : null,
    input, h("p", {}, h("button", { class: "primary", type: "submit" }, "Sign in")));
  mount(main, form);
  input.focus();
}

async function route() {
  if (leave) { leave(); leave = null; }
  if (!apiKey()) return signInForm();
  const [path, search] = (location.hash.slice(1) || "/runs").split("?");
  const q = new URLSearchParams(search || "");
  for (const a of nav.querySelectorAll("a")) a.classList.toggle("active", path.startsWith("/" + a.dataset.page));
  nav.hidden = false; out.hidden = false;
  for (const [re, page] of routes) {
    const m = path.match(re);
    if (m) {
      mount(main, h("p", { class: "muted" }, "Loading…"));
      try { leave = await page(m, q); } catch (err) { mount(main, errorBox(err)); }
      return;
    }
  }
  location.hash = "#/runs";
}

// Any answer 401 (a wrong, revoked or expired key) brings the sign-in form back.
window.addEventListener("agentrt:unauthorized", (e) => {
  if (leave) { leave(); leave = null; }
  signOut();
  signInForm(e.detail || "The API key was refused.");
});
out.addEventListener("click", () => { signOut(); location.hash = "#/runs"; route(); });
window.addEventListener("hashchange", route);
route();
