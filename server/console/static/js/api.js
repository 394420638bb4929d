// The console's only way to the server: the public JSON API with the signed-in key.
const KEY = "agentrt.apiKey";
const TERMINAL = new Set(["run.completed", "run.failed", "run.cancelled"]);

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export function apiKey() { return sessionStorage.getItem(KEY); }
export function signIn(key) { sessionStorage.setItem(KEY, key); }
export function signOut() { sessionStorage.removeItem(KEY); }

function headers(extra = {}) {
  const h = { ...extra };
  const key = apiKey();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

/** Call the API and return its JSON; a non-2xx answer throws ApiError with the server's message. */
export async function api(path, { method = "GET", body, signal } = {}) {
  const init = { method, headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }), signal };
  if (body !== undefined) init.body = JSON.stringify(body);
  const response = await fetch(path, init);
  if (response.status === 204) return null;
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (!response.ok) {
    if (response.status === 401) window.dispatchEvent(new CustomEvent("agentrt:unauthorized", { detail: data?.error?.message }));
    const err = data && data.error ? data.error : { code: "http_" + response.status, message: text || response.statusText };
    throw new ApiError(response.status, err.code, err.message);
  }
  return data;
}

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") q.set(k, v);
  const s = q.toString();
  return s ? "?" + s : "";
}

/**
 * Follow a run's event stream after `after`, calling onEvent for each stored event in order.
 *
 * EventSource cannot send an Authorization header, so the stream is read with fetch. A dropped
 * connection is resumed with Last-Event-ID set to the last seq seen, as the API promises.
 * Returns a function that stops following.
 */
export function follow(runId, after, onEvent, { onState = () => {} } = {}) {
  let last = after;
  let stopped = false;
  let controller = null;
  const run = async () => {
    let delay = 250;
    while (!stopped) {
      controller = new AbortController();
      let ended = false;
      try {
        onState("live");
        const response = await fetch(`/api/runs/${encodeURIComponent(runId)}/events`, {
          headers: headers({ "Last-Event-ID": String(last), Accept: "text/event-stream" }),
          signal: controller.signal,
        });
        if (!response.ok) throw new ApiError(response.status, "stream", await response.text());
        const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += value;
          let cut;
          while ((cut = buffer.indexOf("\n\n")) >= 0) {
            const block = buffer.slice(0, cut);
            buffer = buffer.slice(cut + 2);
            const data = block.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
            if (!data) continue;
            const event = JSON.parse(data);
            if (event.seq <= last) continue;
            last = event.seq;
            onEvent(event);
            if (TERMINAL.has(event.type)) ended = true;
          }
        }
        delay = 250;
      } catch (err) {
        if (stopped) return;
        if (err instanceof ApiError && err.status < 500) { onState("error", err); return; }
      }
      if (ended || stopped) { onState("ended"); return; }
      onState("reconnecting");
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 5000);
    }
  };
  run();
  return () => { stopped = true; if (controller) controller.abort(); };
}
