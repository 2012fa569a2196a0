// pdppo dashboard: an experiment's page (its arms' curves, the median over seeds with the
// min-max band around it, and the report: each arm against the baseline, seed by seed), and the
// experiments table of the jobs page. Over the same /v1/experiments routes as the CLI.
"use strict";

// What the browser tests read: what the page last drew.
const STEP_TICKS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000];
const experimentProbe = { status: null, arms: [], steps: 0, bands: 0, reportRows: 0, draws: 0 };
window.pdppoExperiment = experimentProbe;

function experimentsSection() {
  const body = el("tbody");
  const section = el("section", { id: "experiments-section", hidden: true },
    el("h2", {}, "Experiments"),
    el("table", { id: "experiments" }, el("thead", {}, el("tr", {},
      ...["Name", "Status", "Jobs", "Created"].map((h) => el("th", {}, h)))), body));
  async function refresh() {
    const page = await (await api("GET", "/v1/experiments?limit=20")).json();
    body.replaceChildren(...page.items.map(experimentRow));
    section.hidden = page.items.length === 0;
  }
  return { section, refresh };
}

function countsText(counts) {
  return Object.entries(counts).map(([status, n]) => `${n} ${status}`).join(", ");
}

function experimentRow(exp) {
  const jobs = Object.values(exp.counts).reduce((a, b) => a + b, 0);
  return el("tr", { "data-experiment": exp.id },
    el("td", {}, el("a", { href: `#/experiments/${exp.id}` }, exp.name || exp.id)),
    el("td", {}, el("span", { class: `status ${exp.status}` }, exp.status)),
    el("td", {}, `${jobs}: ${countsText(exp.counts)}`),
    el("td", {}, new Date(exp.created_at).toLocaleString()));
}

// Arms' curves on one chart: per arm a median line and a band from the lowest to the highest
// seed at each step (uPlot `bands` fill between the two edge series, drawn thin).
function curvesChart(box, arms) {
  const names = Object.keys(arms);
  const steps = [...new Set(names.flatMap((n) => arms[n].step))].sort((a, b) => a - b);
  const data = [steps];
  const series = [{ label: "step", value: (u, v) => fmt(v) }];
  const bands = [];
  names.forEach((name, i) => {
    const color = COLORS[i % COLORS.length];
    const at = (key) => {
      const byStep = new Map(arms[name].step.map((s, j) => [s, arms[name][key][j]]));
      return steps.map((s) => byStep.get(s) ?? null);
    };
    const first = data.length;
    data.push(at("median"), at("low"), at("high"));
    series.push({ label: name, stroke: color, width: 2, value: (u, v) => fmt(v) },
      { label: "min", stroke: color + "66", width: 0.5, value: (u, v) => fmt(v) },
      { label: "max", stroke: color + "66", width: 0.5, value: (u, v) => fmt(v) });
    bands.push({ series: [first + 2, first + 1], fill: color + "22" });
  });
  box.replaceChildren();
  const plot = new uPlot({
    width: Math.max(400, box.clientWidth - 16), height: 320,
    scales: { x: { time: false }, y: { range: yRange([null, null]) } },
    axes: [{ label: "step", incrs: STEP_TICKS }, { size: 70, values: (u, ticks) => ticks.map(fmt) }],
    series, bands,
  }, data, box);
  experimentProbe.arms = names;
  experimentProbe.steps = steps.length;
  experimentProbe.bands = bands.length;
  experimentProbe.draws += 1;
  return plot;
}

function reportTable(report) {
  const cell = (v) => el("td", {}, fmt(v));
  const range = (f) => `${fmt(f.median)} [${fmt(f.min)}, ${fmt(f.max)}]`;
  const rows = report.arms.map((arm) => {
    const vs = arm.vs_baseline;
    const reached = arm.steps_to_threshold;
    const ci = vs && vs.ci95 ? `[${fmt(vs.ci95[0])}, ${fmt(vs.ci95[1])}]` : "";
    const sign = vs ? vs.sign_test : null;
    return el("tr", { "data-arm": arm.name },
      el("td", {}, arm.name), el("td", {}, range(arm.final)),
      el("td", {}, reached ? `${reached.reached}/${reached.of}` : "–"),
      cell(arm.masked_fraction.mean),
      el("td", {}, vs ? `${fmt(vs.mean_diff)} ${ci}` : "baseline"),
      el("td", {}, sign ? `${sign.wins}-${sign.losses}-${sign.ties}, p ${sign.p_value == null ? "–" : fmt(sign.p_value)}` : ""),
      el("td", {}, Object.entries(vs ? vs.per_seed : {}).map(([s, d]) => `${s}: ${fmt(d)}`)
        .join(", ")));
  });
  experimentProbe.reportRows = rows.length;
  const heads = ["Arm", `Final ${report.metric}: median [min, max]`, "Reached", "Masked",
    "Vs baseline (95% CI)", "Sign test (w-l-t)", "Per seed"];
  return el("table", { id: "report" },
    el("caption", {}, `paired seeds: ${report.paired_seeds.join(", ") || "none"}`),
    el("thead", {}, el("tr", {}, ...heads.map((h) => el("th", {}, h)))),
    el("tbody", {}, ...rows));
}

function experimentPage(main, id) {
  const head = el("section", { id: "experiment-head" });
  const runs = el("div", { id: "experiment-runs" });
  const metric = el("input", { id: "experiment-metric", value: "reward_mean", size: 24 });
  const baseline = el("select", { id: "experiment-baseline" });
  const threshold = el("input", { id: "experiment-threshold", type: "number", step: "any",
    size: 8 });
  const chart = el("div", { class: "chart", id: "experiment-curves" });
  const report = el("div", { id: "experiment-report" });
  const error = el("p", { class: "error", id: "experiment-error" });
  const query = () => {
    const q = new URLSearchParams({ metric: metric.value.trim() || "reward_mean" });
    if (baseline.value) q.set("baseline", baseline.value);
    if (threshold.value !== "") q.set("threshold", threshold.value);
    return q;
  };
  main.append(head,
    el("section", {}, el("h2", {}, "Curves: median over seeds, band from min to max"),
      el("div", { class: "row" }, "Metric ", metric, " Baseline ", baseline, " Threshold ",
        threshold, " ", el("button", { id: "experiment-update", onclick: () => draw() }, "Update"),
        " ", el("button", { id: "experiment-csv", onclick: () => download(
          `/v1/experiments/${id}/report?${query()}&format=csv`, `${id}-report.csv`) },
        "Download CSV")),
      chart, error),
    el("section", {}, el("h2", {}, "Report"), report),
    el("section", {}, el("h2", {}, "Runs"), runs));

  let left = false;
  let timer = null;
  let plot = null;
  async function act(action, method = "POST") {
    try {
      await api(method, `/v1/experiments/${id}${action ? `/${action}` : ""}`);
      if (method === "DELETE") location.hash = "#/jobs";
      else refresh();
    } catch (err) { error.textContent = err.message; }
  }
  function renderHead(exp) {
    const ended = !["queued", "running", "paused"].includes(exp.status);
    const button = (label, action, method) => el("button",
      { "data-action": label.toLowerCase(), onclick: () => act(action, method) }, label);
    head.replaceChildren(el("h2", {}, exp.name || exp.id, " ",
      el("span", { class: `status ${exp.status}`, id: "experiment-status" }, exp.status)),
    el("p", { class: "muted" }, `${exp.arms.length} arms × ${exp.spec.seeds} seeds: `,
      countsText(exp.counts)),
    el("div", { class: "row" }, ...(ended ? [button("Delete", "", "DELETE")]
      : [button("Cancel", "cancel"), button("Pause", "pause"), button("Resume", "resume")])));
    runs.replaceChildren(...exp.arms.map((arm) => el("div", { class: "arm" },
      el("h3", {}, arm.name), el("ul", {}, ...arm.runs.map((run) => el("li", {},
        el("a", { href: `#/jobs/${run.job_id}` }, `seed ${run.seed}`), " ",
        el("span", { class: `status ${run.status}` }, run.status),
        ` ${run.progress.step} / ${run.progress.total}`))))));
    if (!baseline.options.length) {
      baseline.append(...exp.arms.map((arm) => el("option", { value: arm.name }, arm.name)));
      baseline.value = exp.baseline;
    }
  }
  async function draw() {
    try {
      const q = query();
      const curves = await (await api("GET",
        `/v1/experiments/${id}/curves?metric=${encodeURIComponent(q.get("metric"))}`)).json();
      if (plot) plot.destroy();
      plot = curvesChart(chart, curves.arms);
      const rep = await (await api("GET", `/v1/experiments/${id}/report?${q}`)).json();
      report.replaceChildren(reportTable(rep));
      error.textContent = "";
    } catch (err) {
      error.textContent = err.message;  // a metric no run has yet, say
    }
  }
  async function refresh() {
    clearTimeout(timer);
    try {
      const exp = await (await api("GET", `/v1/experiments/${id}`)).json();
      renderHead(exp);
      await draw();
      experimentProbe.status = exp.status; // once what the page shows is of this state
      if (!left && ["queued", "running", "paused"].includes(exp.status)) {
        timer = setTimeout(refresh, 3000);
      }
    } catch (err) {
      error.textContent = err.message;
      if (!left && err.status !== 404) timer = setTimeout(refresh, 3000);
    }
  }
  refresh();
  return () => { left = true; clearTimeout(timer); if (plot) plot.destroy(); };
}
