// pdppo dashboard: the jobs of one API key, live. Plain JS over the same /v1 API as the CLI:
// this file (the API, the event stream, the log-in and jobs pages), `charts.js`, `job.js` and
// `experiment.js`.
//
// The key lives in sessionStorage (gone with the tab) and travels only in the Authorization
// header: the event stream is read with fetch and a reader, not EventSource, which cannot set
// headers and would need the key in the URL (and so in every proxy's access log).
"use strict";

const KEY = "pdppo.apiKey";
const EXAMPLE_SPEC = `name: smoke
resources: {device: cpu}
train:
  model:
    name: builtin:tiny
    tiny: {d_model: 32, n_layers: 1, n_heads: 2, max_seq_len: 32}
  task: {name: reverse, min_len: 2, max_len: 3}
  rollout: {prompts_per_step: 4, group_size: 4, max_new_tokens: 4}
  algorithm: {mask: predictive, kind: tv, estimator: topk, top_k: 8}
  steps: 8
  checkpoint_every: 2
  device: cpu
`;
// What the browser tests read: counts of what arrived over the stream and what was drawn.
const probe = { loadedAt: Date.now(), events: 0, metrics: 0, reconnects: 0, lastEventId: null,
  drawn: 0, drawMs: 0, chartsBehind: 0, steps: [], phases: [], configs: [] };
window.pdppoDashboard = probe;

let view = null; // the current page's teardown

function sleep(ms) { return new Promise((done) => setTimeout(done, ms)); }
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) node.setAttribute(k, v);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}
// -- API ---------------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.detail) || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

async function api(method, path, body, contentType = "application/json") {
  const headers = { Authorization: `Bearer ${sessionStorage.getItem(KEY)}` };
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = contentType;
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (response.status === 401) {
    logout("The server refused this API key.");
    throw new ApiError(401, null);
  }
  if (!response.ok) {
    let detail = null;
    try { detail = await response.json(); } catch (_) { /* not JSON */ }
    throw new ApiError(response.status, detail);
  }
  return response;
}

async function download(path, filename) {
  const blob = await (await api("GET", path)).blob();
  const link = el("a", { href: URL.createObjectURL(blob), download: filename });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 60_000);
}

// The job's events, from the start or after the last id seen, reconnecting with Last-Event-ID
// whenever the connection drops, until `done` or `signal` aborts.
async function follow(jobId, onEvent, signal) {
  let last = null;
  while (!signal.aborted) {
    try {
      const headers = { Authorization: `Bearer ${sessionStorage.getItem(KEY)}` };
      if (last) headers["Last-Event-ID"] = last;
      const response = await fetch(`/v1/jobs/${jobId}/events`, { headers, signal });
      if (response.status === 429) {
        await sleep(1000 * Number(response.headers.get("Retry-After") || 5));
        continue;
      }
      if (!response.ok) throw new ApiError(response.status, null);
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value.replace(/\r\n?/g, "\n");
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const event = parseFrame(buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
          if (!event) continue; // a ping
          last = event.id || last;
          probe.lastEventId = last;
          onEvent(event);
          if (event.event === "done") return;
        }
      }
    } catch (err) {
      if (signal.aborted) return;
      if (err instanceof ApiError && err.status !== 503) throw err;
    }
    probe.reconnects += 1;
    await sleep(1000);
  }
}

function parseFrame(frame) {
  const event = { event: "message", data: "", id: null };
  let any = false;
  for (const line of frame.split("\n")) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "data") event.data += (event.data ? "\n" : "") + value;
    else if (field === "event") event.event = value;
    else if (field === "id") event.id = value;
    any = true;
  }
  return any ? event : null;
}

// -- pages -------------------------------------------------------------------------------------

function route() {
  if (view) view();
  view = null;
  const main = document.getElementById("main");
  main.replaceChildren();
  const loggedIn = Boolean(sessionStorage.getItem(KEY));
  document.getElementById("logout").hidden = !loggedIn;
  if (!loggedIn) return loginPage(main);
  const match = location.hash.match(/^#\/jobs\/([A-Za-z0-9_-]+)$/);
  const experiment = location.hash.match(/^#\/experiments\/([0-9a-f]{24})$/);
  if (experiment) view = experimentPage(main, experiment[1]);
  else view = match ? jobPage(main, match[1]) : jobsPage(main);
}

function logout(message) {
  sessionStorage.removeItem(KEY);
  route();
  if (message) document.getElementById("login-error").textContent = message;
}

function loginPage(main) {
  const key = el("input", { type: "password", id: "api-key", autocomplete: "off", size: 40 });
  const error = el("p", { class: "error", id: "login-error" });
  const form = el("form", { onsubmit: async (e) => {
    e.preventDefault();
    sessionStorage.setItem(KEY, key.value.trim());
    try {
      await api("GET", "/v1/jobs?limit=1");
      route();
    } catch (err) {
      if (err.status !== 401) error.textContent = `Could not reach the API: ${err.message}`;
    }
  } }, el("label", {}, "API key ", key), " ", el("button", { class: "primary", id: "login" }, "Log in"));
  main.append(el("section", {}, el("h2", {}, "Log in"),
    el("p", { class: "muted" }, "The key stays in this browser tab only."), form, error));
}

function jobsPage(main) {
  const filter = el("select", { id: "status-filter", onchange: () => refresh() },
    ...["", "queued", "running", "paused", "succeeded", "failed", "cancelled"]
      .map((s) => el("option", { value: s }, s || "all")));
  const body = el("tbody");
  const specText = el("textarea", { id: "spec", spellcheck: "false" });
  specText.value = EXAMPLE_SPEC;
  const specErrors = el("div", { class: "error", id: "spec-errors" });
  const submit = el("form", { onsubmit: async (e) => {
    e.preventDefault();
    specErrors.textContent = "";
    let spec;
    try { spec = jsyaml.load(specText.value); } catch (err) {
      specErrors.textContent = `Not YAML or JSON: ${err.message}`;
      return;
    }
    try {
      const job = await (await api("POST", "/v1/jobs", spec)).json();
      location.hash = `#/jobs/${job.id}`;
    } catch (err) {
      const errors = (err.body && err.body.errors) || [];
      specErrors.textContent = errors.length
        ? errors.map((x) => `${x.loc.filter((p) => p !== "body").join(".")}: ${x.msg}`).join("\n")
        : err.message;
    }
  } }, specText, el("div", { class: "row" }, el("button", { class: "primary", id: "submit" },
    "Submit job")), specErrors);

  const experiments = experimentsSection();
  main.append(
    experiments.section,
    el("section", {}, el("h2", {}, "Jobs"), el("div", { class: "row" }, "Status ", filter),
      el("table", { id: "jobs" }, el("thead", {}, el("tr", {}, ...["Name", "Status", "Progress",
        "Reward", "Created", ""].map((h) => el("th", {}, h)))), body)),
    el("section", {}, el("h2", {}, "Submit a job (YAML or JSON spec)"), submit));

  let timer = null;
  let left = false; // the page was left: a refresh still in flight schedules no other
  async function refresh() {
    clearTimeout(timer);
    const status = filter.value ? `&status=${filter.value}` : "";
    try {
      const page = await (await api("GET", `/v1/jobs?limit=100${status}`)).json();
      body.replaceChildren(...page.items.map(jobRow));
      await experiments.refresh();
    } catch (_) { /* shown on the next refresh */ }
    if (!left) timer = setTimeout(refresh, 2000);
  }
  refresh();
  return () => { left = true; clearTimeout(timer); };
}

function jobRow(job) {
  const active = ACTIVE.includes(job.status);
  return el("tr", { "data-job": job.id },
    el("td", {}, el("a", { href: `#/jobs/${job.id}` }, job.name || job.id),
      job.experiment ? el("a", { href: `#/experiments/${job.experiment}`, class: "experiment-link" },
        " (experiment)") : null),
    el("td", {}, el("span", { class: `status ${job.status}` }, job.status), " ",
      el("span", { class: "phase" }, ACTIVE.includes(job.status) ? phaseText(job.phase) : ""), " ",
      warningsBadge(job.warnings)),
    el("td", {}, `${job.progress.step} / ${job.progress.total}`),
    el("td", {}, fmt(job.metrics && job.metrics.reward_mean)),
    el("td", {}, new Date(job.created_at).toLocaleString()),
    el("td", {}, active ? el("button", { onclick: () => api("POST", `/v1/jobs/${job.id}/cancel`) },
      "Cancel") : null));
}

document.getElementById("logout").addEventListener("click", () => logout());
window.addEventListener("hashchange", route);
route();
