// pdppo dashboard: the job page's charts (uPlot), and `fmt`, the one number format of the page.
"use strict";

// Chart panels: title, the y axis's domain, then the series drawn (a name of a step's metrics,
// or a function of them; missing metrics leave gaps). The domain [lo, hi] is what the axis
// always shows (fractions and rewards: 0 to 1), widened only where the data go past it; a null
// end follows the data alone. Without it a flat series of zeros got uPlot's default of 0-100.
const PANELS = [
  ["Reward (mean ± std)", [0, 1], [
    ["mean", (m) => m.reward_mean],
    ["mean + std", (m) => sum(m.reward_mean, m.reward_std)],
    ["mean − std", (m) => sum(m.reward_mean, neg(m.reward_std))],
  ]],
  ["Masked fraction and acceptance", [0, 1], [
    ["masked", (m) => m.masked_fraction],
    ["masked A>0", (m) => m.masked_fraction_pos],
    ["masked A<0", (m) => m.masked_fraction_neg],
    ["acceptance", (m) => sum(1, neg(m.masked_fraction))],
  ]],
  ["Off-policy correction: dropped and clipped", [0, 1], [
    ["dropped", (m) => m.correction_masked_fraction],
    ["clipped", (m) => m.correction_clipped_fraction],
  ]],
  ["Divergence (δ thresholds dashed)", [0, null], [
    ["mean", (m) => m.divergence_mean],
    ["max", (m) => m.divergence_max],
    ["δ low", (m) => m.delta_low, true],
    ["δ high", (m) => m.delta_high, true],
  ]],
  ["Direction disagreement", [0, 1], [
    ["all tokens", (m) => m.direction_disagreement],
    ["far tokens", (m) => m.direction_disagreement_far],
  ]],
  ["Off-policy |log ratio|", [0, null], [["mean", (m) => m.offpolicy_logratio_abs]]],
  ["Loss", [null, null], [["loss", (m) => m.loss]]],
  ["Grad norm", [0, null], [["grad norm", (m) => m.grad_norm]]],
  ["Entropy", [0, null], [["entropy", (m) => m.entropy]]],
  ["Learning rate", [0, null], [["lr", (m) => m.lr]]],
  ["Tokens / s", [0, null], [["tokens/s", (m) => m.tokens_per_s]]],
  ["Step time (s)", [0, null], [["step time (s)", (m) => m.step_time]]],
];
const COLORS = ["#2f6fdb", "#d9822b", "#2e9d5b", "#9b59b6", "#c0392b"];

function sum(a, b) { return a == null || b == null ? null : a + b; }
function neg(a) { return a == null ? null : -a; }
function fmt(v) {
  if (v == null) return "";
  if (typeof v !== "number") return String(v);
  const big = Math.abs(v) >= 1e5;
  return big || (v !== 0 && Math.abs(v) < 1e-2) ? v.toExponential(1) : String(+v.toPrecision(3));
}

// The y range for `domain` ([lo, hi], see PANELS): a domain end where the data stay inside it,
// uPlot's rounded padding where they pass it or there is none, and a band of 1 (or ±10%) around
// a flat series that no domain bounds.
function yRange([lo, hi]) {
  return (u, dataMin, dataMax) => {
    const min = Math.min(dataMin ?? lo ?? 0, lo ?? Infinity);
    const max = Math.max(dataMax ?? hi ?? 1, hi ?? -Infinity);
    if (min === max) {
      const pad = min === 0 ? 1 : Math.abs(min) / 10;
      return [lo === min ? lo : min - pad, hi === max ? hi : max + pad];
    }
    const [niceMin, niceMax] = uPlot.rangeNum(min, max, 0.1, true);
    return [lo === min ? lo : niceMin, hi === max ? hi : niceMax];
  };
}

// A legend value: the hovered step's, else the latest step's (uPlot shows "--" off the plot).
function legendValue(u, v, sidx, idx) {
  if (idx == null) {
    const last = u.data[0].length - 1;
    v = last < 0 ? null : u.data[sidx][last];
  }
  return v == null ? "--" : fmt(v);
}

function makeChart(grid, title, domain, series) {
  const box = el("div", { class: "chart", "data-title": title }, el("h3", {}, title));
  grid.append(box);
  const data = [[], ...series.map(() => [])];
  const plot = new uPlot({
    width: Math.max(300, box.clientWidth - 16), height: 200,
    scales: { x: { time: false }, y: { range: yRange(domain) } },
    axes: [{ label: "step" }, { size: 70, values: (u, ticks) => ticks.map(fmt) }],
    series: [{ label: "step", value: legendValue }, ...series.map(([label, , dashed], i) => ({
      label, stroke: COLORS[i % COLORS.length], width: 1.5, dash: dashed ? [6, 4] : undefined,
      spanGaps: false, value: legendValue,
    }))],
  }, data, box);
  // `drawn`: how many steps the plot holds; `visible`: whether it is on screen now
  const chart = { title, plot, data, series, visible: true, drawn: 0 };
  chart.draw = () => {
    chart.drawn = data[0].length;
    plot.setData(data);
  };
  new IntersectionObserver(([entry]) => {
    chart.visible = entry.isIntersecting;
    if (chart.visible && chart.drawn < data[0].length) chart.draw();
  }).observe(box);
  return chart;
}

// The job page's charts, fed a step at a time by `push` and redrawn by `schedule`: steps arrive
// faster than a long history redraws (11 charts of 10,000 points: about 0.3 s in a
// software-rendered Chromium), so redraws are spaced to leave the page at least half of its
// time for input: the next one waits twice as long as the last one took. A redraw covers the
// charts on screen and, of those off screen, the one longest behind, so that every chart is
// drawn (a full-page screenshot, a print) without the cost of all eleven at every step.
// `before` runs first in each redraw (the page's header: one layout per redraw).
function makeCharts(grid, probe, before) {
  const charts = PANELS.map(([title, domain, series]) => makeChart(grid, title, domain, series));
  window.pdppoCharts = charts;
  let steps = 0;
  let pending = false;
  let drawnAt = 0;
  function schedule() {
    if (pending) return;
    pending = true;
    const wait = Math.max(0, drawnAt + 2 * probe.drawMs - performance.now());
    setTimeout(() => requestAnimationFrame(draw), wait);
  }
  function draw() {
    pending = false;
    const started = performance.now();
    before();
    const behind = charts.filter((c) => c.drawn < steps);
    for (const chart of behind.filter((c) => c.visible)) chart.draw();
    const offScreen = behind.filter((c) => !c.visible).sort((a, b) => a.drawn - b.drawn);
    if (offScreen.length) offScreen[0].draw();
    const drawn = steps;
    probe.chartsBehind = charts.filter((c) => c.drawn < steps).length;
    // uPlot paints in a microtask after setData: a timer runs once it has
    setTimeout(() => {
      drawnAt = performance.now();
      probe.drawMs = drawnAt - started;
      probe.drawn = drawn;
      if (probe.chartsBehind) schedule();
    }, 0);
  }
  function push(step, metrics) {
    steps += 1;
    for (const chart of charts) {
      chart.data[0].push(step);
      chart.series.forEach(([, pick], i) => chart.data[i + 1].push(pick(metrics) ?? null));
    }
    schedule();
  }
  return { push, schedule };
}
