// pdppo dashboard: the jobs of one API key, live. Plain JS over the same /v1 API as the CLI.
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
// Chart panels: title, then the metric series drawn (a name of a step's metrics, or a
// function of them). Missing metrics leave gaps.
const PANELS = [
  ["Reward (mean ± std)", [
    ["mean", (m) => m.reward_mean],
    ["mean + std", (m) => sum(m.reward_mean, m.reward_std)],
    ["mean − std", (m) => sum(m.reward_mean, neg(m.reward_std))],
  ]],
  ["Masked fraction and acceptance", [
    ["masked", (m) => m.masked_fraction],
    ["masked A>0", (m) => m.masked_fraction_pos],
    ["masked A<0", (m) => m.masked_fraction_neg],
    ["acceptance", (m) => sum(1, neg(m.masked_fraction))],
  ]],
  ["Divergence (δ thresholds dashed)", [
    ["mean", (m) => m.divergence_mean],
    ["max", (m) => m.divergence_max],
    ["δ low", (m) => m.delta_low, true],
    ["δ high", (m) => m.delta_high, true],
  ]],
  ["Direction disagreement", [
    ["all tokens", (m) => m.direction_disagreement],
    ["far tokens", (m) => m.direction_disagreement_far],
  ]],
  ["Off-policy |log ratio|", [["mean", (m) => m.offpolicy_logratio_abs]]],
  ["Loss", [["loss", (m) => m.loss]]],
  ["Grad norm", [["grad norm", (m) => m.grad_norm]]],
  ["Entropy", [["entropy", (m) => m.entropy]]],
  ["Learning rate", [["lr", (m) => m.lr]]],
  ["Tokens / s", [["tokens/s", (m) => m.tokens_per_s]]],
  ["Step time (s)", [["step", (m) => m.step_time]]],
];
const COLORS = ["#2f6fdb", "#d9822b", "#2e9d5b", "#9b59b6", "#c0392b"];
const STEERABLE = [
  ["optim.lr", "learning rate"], ["algorithm.delta_low", "δ low"],
  ["algorithm.delta_high", "δ high"], ["algorithm.is_cap", "IS cap"],
  ["rollout.temperature", "temperature"], ["steps", "steps"],
];
const MASKS = ["predictive", "dppo", "ppo_clip", "none"];

// What the browser tests read: counts of what arrived over the stream and what was drawn.
const probe = { loadedAt: Date.now(), events: 0, metrics: 0, reconnects: 0, lastEventId: null,
  drawn: 0, drawMs: 0, configs: [] };
window.pdppoDashboard = probe;

let view = null; // the current page's teardown

function sum(a, b) { return a == null || b == null ? null : a + b; }
function neg(a) { return a == null ? null : -a; }
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
function fmt(v) {
  if (v == null) return "";
  if (typeof v !== "number") return String(v);
  const big = Math.abs(v) >= 1e5;
  return big || (v !== 0 && Math.abs(v) < 1e-2) ? v.toExponential(1) : String(+v.toPrecision(3));
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
  view = match ? jobPage(main, match[1]) : jobsPage(main);
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

  main.append(
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
    } catch (_) { /* shown on the next refresh */ }
    if (!left) timer = setTimeout(refresh, 2000);
  }
  refresh();
  return () => { left = true; clearTimeout(timer); };
}

function jobRow(job) {
  const active = ["queued", "running", "paused"].includes(job.status);
  return el("tr", { "data-job": job.id },
    el("td", {}, el("a", { href: `#/jobs/${job.id}` }, job.name || job.id)),
    el("td", {}, el("span", { class: `status ${job.status}` }, job.status)),
    el("td", {}, `${job.progress.step} / ${job.progress.total}`),
    el("td", {}, fmt(job.metrics && job.metrics.reward_mean)),
    el("td", {}, new Date(job.created_at).toLocaleString()),
    el("td", {}, active ? el("button", { onclick: () => api("POST", `/v1/jobs/${job.id}/cancel`) },
      "Cancel") : null));
}

function jobPage(main, jobId) {
  const abort = new AbortController();
  const head = el("section", { id: "job-head" });
  const steer = el("section", { class: "steer" });
  const grid = el("div", { class: "grid" });
  const configs = el("tbody", { id: "configs" });
  const evals = el("div", { id: "evals" });
  const samples = el("div", { id: "samples" });
  const checkpoints = el("ul", { id: "checkpoints" });
  const log = el("div", { id: "log" });
  main.append(head, steer, el("section", {}, el("h2", {}, "Charts"), grid),
    el("section", {}, el("h2", {}, "Config changes"), el("table", {}, el("thead", {},
      el("tr", {}, el("th", {}, "After step"), el("th", {}, "Version"), el("th", {}, "Changes"))),
      configs)),
    el("section", {}, el("h2", {}, "Evaluations"), evals),
    el("section", {}, el("h2", {}, "Samples"), samples),
    el("section", {}, el("h2", {}, "Checkpoints"), checkpoints),
    el("section", {}, el("h2", {}, "Log"), log));

  const charts = PANELS.map(([title, series]) => makeChart(grid, title, series));
  const steps = [];
  // Steps arrive faster than a long history redraws (11 charts of 10,000 points: about 0.3 s
  // in a software-rendered Chromium), so redraws are spaced to leave the page at least half of
  // its time for input: the next one waits twice as long as the last one took.
  let pending = false;
  let drawnAt = 0;
  function scheduleDraw() {
    if (pending) return;
    pending = true;
    const wait = Math.max(0, drawnAt + 2 * probe.drawMs - performance.now());
    setTimeout(() => requestAnimationFrame(draw), wait);
  }
  function draw() {
    pending = false;
    const started = performance.now();
    // only the charts on screen: one scrolled into view is drawn then (`makeChart`)
    if (job) renderHead(head, job);
    for (const chart of charts) if (chart.visible) chart.plot.setData(chart.data);
    const drawn = steps.length;
    // uPlot paints in a microtask after setData: a timer runs once it has
    setTimeout(() => {
      drawnAt = performance.now();
      probe.drawMs = drawnAt - started;
      probe.drawn = drawn;
    }, 0);
  }
  let job = null;
  async function refreshJob() {
    try {
      job = await (await api("GET", `/v1/jobs/${jobId}`)).json();
    } catch (err) {
      head.replaceChildren(el("p", { class: "error" }, err.message));
      return;
    }
    renderHead(head, job);
    if (!steer.dataset.ready) renderSteer(steer, job, refreshJob);
    const list = await (await api("GET", `/v1/jobs/${jobId}/checkpoints`)).json();
    checkpoints.replaceChildren(...list.items.map((c) => el("li", {}, el("a", {
      href: "#", onclick: (e) => { e.preventDefault(); download(c.download_url, `${c.name}.tar`); },
    }, c.name), ` (step ${c.step}, ${(c.size_bytes / 2 ** 20).toFixed(1)} MiB)`)));
  }

  function onEvent(event) {
    probe.events += 1;
    const data = event.data ? JSON.parse(event.data) : {};
    if (event.event === "metrics") {
      probe.metrics += 1;
      steps.push(data.step);
      probe.steps = steps;
      for (const chart of charts) {
        chart.data[0].push(data.step);
        chart.series.forEach(([, pick], i) => chart.data[i + 1].push(pick(data.metrics) ?? null));
      }
      if (job) {
        job.progress = { step: data.step, total: data.total };
        job.metrics = data.metrics;
      }
      scheduleDraw(); // the header too: one layout per redraw, not one per event
    } else if (event.event === "config") {
      probe.configs.push(data);
      configs.append(el("tr", {}, el("td", {}, data.step), el("td", {}, data.version),
        el("td", {}, Object.entries(data.changes).map(([k, v]) => `${k} = ${v}`).join(", "))));
    } else if (event.event === "log") {
      log.append(el("div", { class: data.level || "" }, `${data.at || ""} ${data.message}`));
      log.scrollTop = log.scrollHeight;
    } else if (event.event === "eval") {
      evals.prepend(el("div", {}, `step ${data.step}: ` + Object.entries(data.metrics)
        .map(([k, v]) => `${k} ${fmt(v)}`).join(", ")));
    } else if (event.event === "samples") {
      samples.replaceChildren(el("p", { class: "muted" }, `step ${data.step}`),
        ...data.samples.map((s) => el("div", {}, el("code", {}, s.prompt), " → ",
          el("code", {}, s.completion), ` reward ${fmt(s.reward)}`)));
    } else if (event.event === "status" || event.event === "checkpoint" || event.event === "done") {
      refreshJob();
    }
  }

  head.addEventListener("changed", refreshJob);
  refreshJob();
  follow(jobId, onEvent, abort.signal).catch((err) => log.append(el("div", { class: "error" },
    `event stream: ${err.message}`)));
  return () => abort.abort();
}

function makeChart(grid, title, series) {
  const box = el("div", { class: "chart", "data-title": title }, el("h3", {}, title));
  grid.append(box);
  const data = [[], ...series.map(() => [])];
  const plot = new uPlot({
    width: Math.max(300, box.clientWidth - 16), height: 200,
    scales: { x: { time: false } },
    axes: [{ label: "step" }, { size: 70, values: (u, ticks) => ticks.map(fmt) }],
    series: [{ label: "step" }, ...series.map(([label, , dashed], i) => ({
      label, stroke: COLORS[i % COLORS.length], width: 1.5, dash: dashed ? [6, 4] : undefined,
      spanGaps: false,
    }))],
  }, data, box);
  const chart = { plot, data, series, visible: true };
  new IntersectionObserver(([entry]) => {
    chart.visible = entry.isIntersecting;
    if (chart.visible) plot.setData(data);
  }).observe(box);
  return chart;
}

// The job's header, built once per page and then updated in place: rebuilding it at every
// step would swap the buttons under the user's pointer (a click could land on a removed node).
function renderHead(head, job) {
  if (!head.parts) {
    const post = (path) => async () => {
      await api("POST", `/v1/jobs/${job.id}/${path}`);
      head.dispatchEvent(new Event("changed")); // the page reads the job again
    };
    const parts = {
      title: el("span"), status: el("span", { id: "job-status" }),
      bar: el("progress"), progress: el("span", { id: "job-progress" }),
      pause: el("button", { id: "job-pause", onclick: post("pause") }, "Pause"),
      resume: el("button", { id: "job-resume", onclick: post("resume") }, "Resume"),
      cancel: el("button", { id: "job-cancel", onclick: post("cancel") }, "Cancel"),
      error: el("p", { class: "error" }), about: el("p", { class: "muted" }),
    };
    const csv = el("button", { id: "csv", onclick: () => download(
      `/v1/jobs/${job.id}/metrics?format=csv`, `${job.id}-metrics.csv`) }, "Download metrics CSV");
    head.replaceChildren(el("h2", {}, parts.title, " ", parts.status),
      el("div", { class: "row" }, parts.bar, parts.progress, parts.pause, parts.resume,
        parts.cancel, csv), parts.error, parts.about);
    head.parts = parts;
  }
  const parts = head.parts;
  const p = job.progress;
  parts.title.textContent = job.name || job.id;
  parts.status.textContent = job.pause_requested ? "pausing" : job.status;
  parts.status.className = `status ${job.status}`;
  parts.bar.max = p.total || 1;
  parts.bar.value = p.step;
  parts.progress.textContent = `step ${p.step} / ${p.total}`;
  parts.pause.disabled = !["running", "queued"].includes(job.status) || job.pause_requested;
  parts.resume.disabled = !(job.status === "paused" || job.pause_requested);
  parts.cancel.disabled = !["queued", "running", "paused"].includes(job.status);
  parts.error.textContent = job.error ? `${job.error.code}: ${job.error.message}` : "";
  parts.about.textContent = `id ${job.id} · queue ${job.queue} · created `
    + `${new Date(job.created_at).toLocaleString()} · attempts ${job.attempts}`;
}

function renderSteer(steer, job, refresh) {
  steer.dataset.ready = "1";
  const train = job.spec.train;
  const value = (path) => path.split(".").reduce((node, part) => node && node[part], train);
  const inputs = STEERABLE.map(([path, label]) => [path, el("input", {
    id: `steer-${path}`, type: "number", step: "any", placeholder: String(value(path)) })]);
  const mask = el("select", { id: "steer-algorithm.mask" }, el("option", { value: "" },
    `mask (${train.algorithm.mask})`), ...MASKS.map((m) => el("option", { value: m }, m)));
  const message = el("span", { id: "steer-message" });
  const form = el("form", { onsubmit: async (e) => {
    e.preventDefault();
    const patch = {};
    const put = (path, v) => {
      const parts = path.split(".");
      let node = patch;
      for (const part of parts.slice(0, -1)) node = node[part] = node[part] || {};
      node[parts.at(-1)] = v;
    };
    for (const [path, input] of inputs) {
      if (input.value !== "") put(path, path === "steps" ? parseInt(input.value, 10) : Number(input.value));
    }
    if (mask.value) put("algorithm.mask", mask.value);
    if (!Object.keys(patch).length) return;
    message.className = "";
    try {
      const updated = await (await api("PATCH", `/v1/jobs/${job.id}`, { train: patch },
        "application/merge-patch+json")).json();
      message.textContent = `change ${updated.config_version} sent; it applies at the next step`;
      for (const [path, input] of inputs) {
        input.value = "";
        input.placeholder = String(path.split(".").reduce((n, k) => n && n[k], updated.spec.train));
      }
      refresh();
    } catch (err) {
      message.className = "error";
      message.textContent = err.message;
    }
  } }, el("div", { class: "row" }, ...inputs.map(([path, input]) => el("label", {},
    STEERABLE.find(([p]) => p === path)[1], input)), mask,
  el("button", { class: "primary", id: "steer-apply" }, "Apply")), message);
  steer.replaceChildren(el("h2", {}, "Steer (applies at the next step)"), form);
}

document.getElementById("logout").addEventListener("click", () => logout());
window.addEventListener("hashchange", route);
route();
