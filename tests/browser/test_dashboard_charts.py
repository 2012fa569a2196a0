"""What a new user of the job page found, each checked in a real Chromium against the real
service: chart axes that ran 0-100 for fractions and rewards that were all 0, a step-time series
labelled "step", legends that read "--" unless hovered, charts below the fold blank in a
full-page screenshot, and a steering error left on screen after later actions worked. Also how
a job's phase and warnings read (from literal records: the end-to-end check is
test_dashboard_phase.py)."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import yaml

from tests.browser.dashboard import TIMEOUT_MS, login, long_spec, wait_probe
from tests.browser.never_matching import submit_never_matching
from tests.support.stack import KEYS, Service
from tests.support.waits import wait_for

# Where each chart's canvas lies on the page, and which of them show fewer than 500 pixels
# that are not the white of their box in a full-page screenshot (decoded in the page itself: no
# image library here): nothing was drawn there.
CANVASES = """() => [...document.querySelectorAll(".chart")].map((box) => {
  const r = box.querySelector("canvas").getBoundingClientRect();
  return [box.dataset.title, Math.round(r.left + scrollX), Math.round(r.top + scrollY),
    Math.round(r.width), Math.round(r.height)];
})"""
BLANK_CHARTS = """async ([png, canvases]) => {
  const bytes = Uint8Array.from(atob(png), (c) => c.charCodeAt(0));
  const image = await createImageBitmap(new Blob([bytes], { type: "image/png" }));
  const canvas = new OffscreenCanvas(image.width, image.height);
  const context = canvas.getContext("2d");
  context.drawImage(image, 0, 0);
  const blank = [];
  for (const [title, x, y, width, height] of canvases) {
    const { data } = context.getImageData(x, y, width, height);
    let inked = 0;
    for (let i = 0; i < data.length; i += 4) {
      if (data[i] < 240 || data[i + 1] < 240 || data[i + 2] < 240) inked += 1;
    }
    if (inked < 500) blank.push(title);
  }
  return blank;
}"""


def blank_charts(page: Any) -> list[str] | None:
    """The charts blank in a full-page screenshot; None if the layout moved while it was taken
    (the header grows once the job is read again), which would misplace them."""
    canvases = page.evaluate(CANVASES)
    png = base64.b64encode(page.screenshot(full_page=True)).decode()
    if page.evaluate(CANVASES) != canvases:
        return None
    return list(page.evaluate(BLANK_CHARTS, [png, canvases]))


RANGES = """() => Object.fromEntries(window.pdppoCharts.map(
  (c) => [c.title, [c.plot.scales.y.min, c.plot.scales.y.max]]))"""

LEGENDS = """() => Object.fromEntries([...document.querySelectorAll(".chart")].map((c) => [
  c.dataset.title, [...c.querySelectorAll(".u-legend .u-series")].map(
    (row) => [row.querySelector(".u-label").textContent, row.querySelector(".u-value").textContent]
  )]))"""


def latest_legends(page: Any) -> dict[str, list[list[str]]]:
    """The legends once every chart has set them: a chart redrawn as the job is read again shows
    `--` for a moment (a loaded run in CI read the step time's legend in that moment)."""
    legends: dict[str, list[list[str]]] = page.evaluate(LEGENDS)
    for _ in range(40):
        if all(value != "--" for rows in legends.values() for _, value in rows):
            break
        page.wait_for_timeout(250)
        legends = page.evaluate(LEGENDS)
    return legends


def fmt(page: Any, value: float) -> str:
    """The page's own number format (`fmt` in charts.js), as its axes and legends use it."""
    return str(page.evaluate("(v) => fmt(v)", value))


def test_charts_read_their_domain_show_latest_values_and_all_draw_without_scrolling(
    page: Any, service: Service
) -> None:
    steps = 12
    with httpx.Client(
        base_url=service.base_url, headers={"Authorization": f"Bearer {KEYS['alice']}"}
    ) as alice:
        job_id = submit_never_matching(alice, steps)
        done = wait_for(alice, job_id, lambda j: j["status"] not in {"queued", "running"}, 120)
        assert done["status"] == "succeeded", done
        rows = alice.get(f"/v1/jobs/{job_id}/metrics").json()["items"]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert {r["metrics"]["reward_mean"] for r in rows} == {0.0}  # the grader never matched

    login(page, service.base_url, KEYS["alice"])
    page.wait_for_selector("#spec")
    page.goto(f"{service.base_url}/ui/#/jobs/{job_id}")
    wait_probe(page, f"p.drawn >= {steps}")

    # every chart is drawn in a full-page screenshot, none of them scrolled to
    blank: list[str] | None = None
    for _ in range(20):
        blank = blank_charts(page)
        if blank == []:
            break
        page.wait_for_timeout(250)
    assert page.evaluate("() => scrollY") == 0
    assert blank == []

    # fractions and rewards, all in [0, 1] (rewards all 0 here), on a 0-1 axis, not 0-100
    ranges = page.evaluate(RANGES)
    assert ranges["Reward (mean ± std)"] == [0, 1]
    assert ranges["Masked fraction and acceptance"] == [0, 1]
    assert ranges["Off-policy correction: dropped and clipped"] == [0, 1]
    assert ranges["Direction disagreement"] == [0, 1]
    assert ranges["Step time (s)"][0] == 0
    assert ranges["Step time (s)"][1] >= max(r["metrics"]["step_time"] for r in rows)

    # the legends show the latest step's values without hovering; the step time is named so
    latest = rows[-1]["metrics"]
    legends = latest_legends(page)
    assert legends["Loss"] == [["step", str(steps)], ["loss", fmt(page, latest["loss"])]]
    assert legends["Step time (s)"] == [
        ["step", str(steps)],
        ["step time (s)", fmt(page, latest["step_time"])],
    ]
    assert legends["Reward (mean ± std)"][1] == ["mean", "0"]
    assert legends["Learning rate"][1] == ["lr", fmt(page, latest["lr"])]
    assert legends["Off-policy correction: dropped and clipped"] == [
        ["step", str(steps)],
        ["dropped", fmt(page, latest["correction_masked_fraction"])],
        ["clipped", fmt(page, latest["correction_clipped_fraction"])],
    ]

    # hovering the first step shows its values; leaving the chart shows the latest again
    loss = page.locator(".chart[data-title='Loss']")
    loss.scroll_into_view_if_needed()
    over = loss.locator(".u-over").bounding_box()
    page.mouse.move(over["x"] + 1, over["y"] + over["height"] / 2)
    first = rows[0]["metrics"]["loss"]
    page.wait_for_function(
        "(v) => document.querySelector(\".chart[data-title='Loss'] .u-series:nth-child(2)"
        ' .u-value").textContent === v',
        arg=fmt(page, first),
    )
    assert page.evaluate(LEGENDS)["Loss"][0] == ["step", "1"]
    page.mouse.move(5, 5)
    assert page.evaluate(LEGENDS)["Loss"] == legends["Loss"]


def test_a_steering_error_is_cleared_by_the_next_action_that_works(
    page: Any, service: Service
) -> None:
    with httpx.Client(
        base_url=service.base_url, headers={"Authorization": f"Bearer {KEYS['alice']}"}
    ) as alice:
        job_id = alice.post("/v1/jobs", json=yaml.safe_load(long_spec())).json()["id"]
        login(page, service.base_url, KEYS["alice"])
        page.wait_for_selector("#spec")
        page.goto(f"{service.base_url}/ui/#/jobs/{job_id}")
        page.wait_for_selector("#job-status:text-is('running')", timeout=TIMEOUT_MS)

        page.fill("[id='steer-optim.lr']", "0")
        page.click("#steer-apply")
        error = page.wait_for_selector("#steer-message.error:has-text('greater than 0')")
        assert error.inner_text() == "train.optim.lr: Input should be greater than 0"

        page.click("#job-pause")  # works: the error goes
        page.wait_for_selector("#job-status:text-is('paused')", timeout=TIMEOUT_MS)
        assert page.locator(".error:has-text('greater than 0')").count() == 0
        assert page.inner_text("#steer-message") == ""

        page.click("#job-cancel")
        page.wait_for_selector("#job-status:text-is('cancelled')", timeout=TIMEOUT_MS)
        assert alice.get(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"


def test_a_jobs_phase_and_warnings_read_in_the_list_and_on_its_page(
    page: Any, service: Service
) -> None:
    """From records shaped as the API serves them (`phase`, `warnings`)."""
    login(page, service.base_url, KEYS["alice"])
    page.wait_for_selector("#spec")
    phases = page.evaluate(
        """() => [
          phaseText({name: "warm-up", done: 12, total: 65}),
          phaseText({name: "training", done: 40, total: 200}),
          phaseText({name: "evaluating", done: null, total: null}),
          phaseText({name: "saving", done: 3, total: null}),
          phaseText(null),
        ]"""
    )
    assert phases == ["warm-up 12/65", "training 40/200", "evaluating", "saving 3", ""]
    shown = page.evaluate(
        """() => {
          const base = {id: "j1", name: "n", progress: {step: 0, total: 65}, metrics: null,
            created_at: "2026-12-01T00:00:00Z", queue: "cpu", attempts: 1, error: null};
          const running = {...base, status: "running", warnings: [],
            phase: {name: "warm-up", done: 12, total: 65}};
          const ended = {...base, status: "succeeded", phase: null, warnings: [
            {code: "no_reward_variance", message: "every group had equal rewards"},
            {code: "rewards_all_zero", message: "every reward was 0"}]};
          const row = (job) => {
            const tr = jobRow(job);
            const badge = tr.querySelector(".badge");
            return [tr.querySelector(".phase").textContent, badge && badge.textContent,
              badge && badge.title];
          };
          const head = (job) => {
            const section = document.createElement("section");
            renderHead(section, job, {run() {}, download() {}});
            return [section.querySelector("#job-phase").textContent,
              section.querySelector("#job-warnings").textContent,
              [...section.querySelectorAll("#job-warning-list li")].map((li) => li.textContent)];
          };
          return {rows: [row(running), row(ended)], heads: [head(running), head(ended)]};
        }"""
    )
    messages = "every group had equal rewards\nevery reward was 0"
    assert shown["rows"] == [["warm-up 12/65", None, None], ["", "⚠ 2 warnings", messages]]
    assert shown["heads"] == [
        ["warm-up 12/65", "", []],
        [
            "",
            "⚠ 2 warnings",
            [
                "no_reward_variance: every group had equal rewards",
                "rewards_all_zero: every reward was 0",
            ],
        ],
    ]
