// pdppo dashboard: one job's page (header, steering, charts, events), and how a job's phase and
// warnings read, here and in the jobs list.
"use strict";

const STEERABLE = [
  ["optim.lr", "learning rate"], ["algorithm.delta_low", "δ low"],
  ["algorithm.delta_high", "δ high"], ["algorithm.is_cap", "IS cap"],
  ["rollout.temperature", "temperature"], ["steps", "steps"],
];
const MASKS = ["predictive", "dppo", "ppo_clip", "none"];
const ACTIVE = ["queued", "running", "paused"];

// "warm-up 12/65", "training 40/200", "evaluating": what a running job is doing now. The server
// sends null while queued and once the job has ended.
function phaseText(phase) {
  if (!phase || !phase.name) return "";
  if (phase.done == null) return phase.name;
  return phase.total == null ? `${phase.name} ${phase.done}` : `${phase.name} ${phase.done}/${phase.total}`;
}

// A badge counting the job's warnings (a job can succeed and still have learned nothing), the
// messages in its tooltip; null when there are none.
function warningsBadge(warnings) {
  if (!warnings || !warnings.length) return null;
  const n = warnings.length;
  return el("span", { class: "badge warning", title: warnings.map((w) => w.message).join("\n") },
    `⚠ ${n} warning${n === 1 ? "" : "s"}`);
}

function jobPage(main, jobId) {
  const abort = new AbortController();
  probe.steps = [];
  probe.phases = [];
  const head = el("section", { id: "job-head" });
  const steer = el("section", { class: "steer" });
  const tryBox = el("section", { id: "job-try", class: "try", hidden: true });
  const grid = el("div", { class: "grid" });
  const configs = el("tbody", { id: "configs" });
  const evals = el("div", { id: "evals" });
  const samples = el("div", { id: "samples" });
  const checkpoints = el("ul", { id: "checkpoints" });
  const log = el("div", { id: "log" });
  main.append(head, steer, tryBox, el("section", {}, el("h2", {}, "Charts"), grid),
    el("section", {}, el("h2", {}, "Config changes"), el("table", {}, el("thead", {},
      el("tr", {}, el("th", {}, "After step"), el("th", {}, "Version"), el("th", {}, "Changes"))),
      configs)),
    el("section", {}, el("h2", {}, "Evaluations"), evals),
    el("section", {}, el("h2", {}, "Samples"), samples),
    el("section", {}, el("h2", {}, "Checkpoints"), checkpoints),
    el("section", {}, el("h2", {}, "Log"), log));

  let job = null;
  const charts = makeCharts(grid, probe, () => { if (job) renderHead(head, job, actions); });

  // What the user does here (steer, pause, resume, cancel, download) says how it went: a
  // failure is shown where it happened until the next action that works, which clears them all.
  const actions = {
    failed(where, err) {
      where.classList.add("error", "action-error");
      where.textContent = err.message;
    },
    done() {
      for (const node of main.querySelectorAll(".action-error")) {
        node.classList.remove("error", "action-error");
        node.textContent = "";
      }
    },
    async run(where, work) {
      try {
        const result = await work();
        actions.done();
        return result;
      } catch (err) {
        actions.failed(where, err);
        return undefined;
      }
    },
    download(where, path, filename) { return actions.run(where, () => download(path, filename)); },
  };

  async function refreshJob() {
    try {
      job = await (await api("GET", `/v1/jobs/${jobId}`)).json();
    } catch (err) {
      head.replaceChildren(el("p", { class: "error" }, err.message));
      return;
    }
    renderHead(head, job, actions);
    if (!steer.dataset.ready) renderSteer(steer, job, refreshJob, actions);
    if (job.status === "succeeded" && !tryBox.dataset.ready) renderTry(tryBox, job, actions);
    const list = await (await api("GET", `/v1/jobs/${jobId}/checkpoints`)).json();
    checkpoints.replaceChildren(...list.items.map((c) => el("li", {}, el("a", {
      href: "#", onclick: (e) => {
        e.preventDefault();
        actions.download(head.parts.action, c.download_url, `${c.name}.tar`);
      },
    }, c.name), ` (step ${c.step}, ${(c.size_bytes / 2 ** 20).toFixed(1)} MiB)`)));
  }

  function onEvent(event) {
    probe.events += 1;
    const data = event.data ? JSON.parse(event.data) : {};
    if (event.event === "metrics") {
      probe.metrics += 1;
      probe.steps.push(data.step);
      charts.push(data.step, data.metrics);
      if (job) {
        job.progress = { step: data.step, total: data.total };
        job.metrics = data.metrics;
        // training's progress is the step: its phase event comes once, at its start
        if (job.phase && job.phase.name === "training") job.phase.done = data.step;
      }
    } else if (event.event === "phase") {
      probe.phases.push(phaseText(data));
      // a replay of an ended job's stream: its record already says it is over
      if (job && ACTIVE.includes(job.status)) {
        job.phase = { name: data.name, done: data.done, total: data.total };
        charts.schedule(); // the header too, with the next redraw
      }
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

// The job's header, built once per page and then updated in place: rebuilding it at every
// step would swap the buttons under the user's pointer (a click could land on a removed node).
function renderHead(head, job, actions) {
  if (!head.parts) {
    const parts = {
      title: el("span"), status: el("span", { id: "job-status" }),
      phase: el("span", { id: "job-phase", class: "phase" }),
      warnings: el("span", { id: "job-warnings" }),
      bar: el("progress"), progress: el("span", { id: "job-progress" }),
      error: el("p", { class: "error" }), about: el("p", { class: "muted" }),
      warningList: el("ul", { id: "job-warning-list", class: "warning" }),
      trackers: el("p", { id: "job-trackers", class: "muted" }),
      action: el("p", { id: "job-action-error" }),
    };
    const post = (path) => () => actions.run(parts.action, async () => {
      await api("POST", `/v1/jobs/${job.id}/${path}`);
      head.dispatchEvent(new Event("changed")); // the page reads the job again
    });
    parts.pause = el("button", { id: "job-pause", onclick: post("pause") }, "Pause");
    parts.resume = el("button", { id: "job-resume", onclick: post("resume") }, "Resume");
    parts.cancel = el("button", { id: "job-cancel", onclick: post("cancel") }, "Cancel");
    const csv = el("button", { id: "csv", onclick: () => actions.download(parts.action,
      `/v1/jobs/${job.id}/metrics?format=csv`, `${job.id}-metrics.csv`) }, "Download metrics CSV");
    head.replaceChildren(
      el("h2", {}, parts.title, " ", parts.status, " ", parts.phase, " ", parts.warnings),
      el("div", { class: "row" }, parts.bar, parts.progress, parts.pause, parts.resume,
        parts.cancel, csv), parts.action, parts.error, parts.warningList, parts.trackers,
      parts.about);
    head.parts = parts;
  }
  const parts = head.parts;
  const p = job.progress;
  const active = ACTIVE.includes(job.status);
  parts.title.textContent = job.name || job.id;
  parts.status.textContent = job.pause_requested ? "pausing" : job.status;
  parts.status.className = `status ${job.status}`;
  parts.phase.textContent = active ? phaseText(job.phase) : "";
  parts.warnings.replaceChildren(...[warningsBadge(job.warnings)].filter(Boolean));
  const warnings = job.warnings || [];
  if (parts.warningList.childElementCount !== warnings.length) {
    parts.warningList.replaceChildren(...warnings.map((w) => el("li", { "data-code": w.code },
      `${w.code}: ${w.message}`)));
  }
  const trackers = Object.entries(job.trackers || {});
  if (parts.trackers.childElementCount !== trackers.length) {
    parts.trackers.replaceChildren(...trackers.map(([name, run]) => trackerLink(name, run)));
  }
  parts.bar.max = p.total || 1;
  parts.bar.value = p.step;
  parts.progress.textContent = `step ${p.step} / ${p.total}`;
  parts.pause.disabled = !["running", "queued"].includes(job.status) || job.pause_requested;
  parts.resume.disabled = !(job.status === "paused" || job.pause_requested);
  parts.cancel.disabled = !active;
  parts.error.textContent = job.error ? `${job.error.code}: ${job.error.message}` : "";
  parts.about.textContent = `id ${job.id} · queue ${job.queue} · created `
    + `${new Date(job.created_at).toLocaleString()} · attempts ${job.attempts}`;
}

// An experiment-tracker run the job reports to (train.report_to): a link to its page where the
// tracker has one (MLflow, W&B online; http(s) only), else its id (TensorBoard's folder).
function trackerLink(name, run) {
  const url = run.url && /^https?:\/\//.test(run.url) ? run.url : null;
  const label = `${name}: ${url ? "open run" : run.run_id}`;
  return el("span", { class: "tracker", "data-tracker": name },
    url ? el("a", { href: url, target: "_blank", rel: "noopener" }, label) : label, " ");
}

function renderSteer(steer, job, refresh, actions) {
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
    const updated = await actions.run(message, async () => (await api("PATCH",
      `/v1/jobs/${job.id}`, { train: patch }, "application/merge-patch+json")).json());
    if (!updated) return;
    message.textContent = `change ${updated.config_version} sent; it applies at the next step`;
    for (const [path, input] of inputs) {
      input.value = "";
      input.placeholder = String(path.split(".").reduce((n, k) => n && n[k], updated.spec.train));
    }
    refresh();
  } }, el("div", { class: "row" }, ...inputs.map(([path, input]) => el("label", {},
    STEERABLE.find(([p]) => p === path)[1], input)), mask,
  el("button", { class: "primary", id: "steer-apply" }, "Apply")), message);
  steer.replaceChildren(el("h2", {}, "Steer (applies at the next step)"), form);
}

// A prompt box for a succeeded job: its final model answers on a sample worker
// (POST /v1/jobs/{id}/completions). Shown once the job has succeeded, never before.
function renderTry(box, job, actions) {
  box.dataset.ready = "1";
  box.hidden = false;
  const prompt = el("textarea", { id: "try-prompt", rows: 3, placeholder: "a prompt" });
  const chat = el("input", { id: "try-chat", type: "checkbox" });
  const maxTokens = el("input", { id: "try-max-tokens", type: "number", min: 1, value: 32 });
  const temperature = el("input", { id: "try-temperature", type: "number", min: 0, max: 2,
    step: "any", value: 1 });
  const send = el("button", { class: "primary", id: "try-send" }, "Generate");
  const message = el("span", { id: "try-message", class: "muted" });
  const answer = el("div", { id: "try-answers" });
  const form = el("form", { onsubmit: async (e) => {
    e.preventDefault();
    if (!prompt.value) return;
    const body = { max_tokens: parseInt(maxTokens.value, 10) || 32,
      temperature: Number(temperature.value) };
    if (chat.checked) body.messages = [{ role: "user", content: prompt.value }];
    else body.prompt = prompt.value;
    send.disabled = true;
    message.textContent = "generating …";
    const out = await actions.run(message, async () => (await api("POST",
      `/v1/jobs/${job.id}/completions`, body)).json());
    send.disabled = false;
    if (!out) return;
    message.textContent = `${out.usage.completion_tokens} tokens in `
      + `${Math.round(out.timings.total_ms)} ms${out.cold ? " (model loaded)" : ""}`;
    answer.replaceChildren(...out.choices.map((c) => el("pre", { class: "try-answer",
      "data-finish": c.finish_reason }, c.text)));
  } }, prompt, el("div", { class: "row" }, el("label", {}, chat, " as a chat turn"),
    el("label", {}, "max tokens ", maxTokens), el("label", {}, "temperature ", temperature),
    send, message));
  box.replaceChildren(el("h2", {}, "Try the model"), form, answer);
}
