"""The dashboard against the real service (redis-server, `pdppo serve`, a CPU worker) in a real
headless Chromium: log in, submit a spec from the form, watch the charts fill from live events,
change the learning rate, pause, resume, download the CSV, cancel."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import httpx

from tests.browser.dashboard import TIMEOUT_MS, login, long_spec, probe, wait_probe
from tests.browser.stream_cutter import StreamCutter
from tests.support.specs import smoke_spec
from tests.support.stack import KEYS, Service
from tests.support.waits import wait_for


def test_a_wrong_key_is_refused_and_spec_errors_show_next_to_the_form(
    page: Any, service: Service
) -> None:
    login(page, service.base_url, "not-a-key")
    page.wait_for_selector("#login-error:has-text('refused')")
    assert page.evaluate("() => sessionStorage.getItem('pdppo.apiKey')") is None
    page.fill("#api-key", KEYS["alice"])
    page.click("#login")
    page.wait_for_selector("#spec")
    page.fill("#spec", "train:\n  steps: -1\n")
    page.click("#submit")
    errors = page.wait_for_selector("#spec-errors:has-text('train.steps')")
    assert "greater than or equal to 1" in errors.inner_text()
    assert page.evaluate("() => location.hash") == ""  # nothing was submitted
    # the key is in the tab's session only, never in a URL the page fetched
    urls: list[str] = []
    page.on("request", lambda request: urls.append(request.url))
    page.select_option("#status-filter", "succeeded")
    page.wait_for_timeout(500)
    assert urls and not any(KEYS["alice"] in url for url in urls)


def test_submit_watch_steer_pause_resume_download_and_cancel(
    page: Any, service: Service, artifacts: Path
) -> None:
    login(page, service.base_url, KEYS["alice"])
    page.wait_for_selector("#spec")
    page.fill("#spec", long_spec())
    page.click("#submit")
    page.wait_for_url("**/ui/#/jobs/*")
    job_id = page.evaluate("() => location.hash.split('/').pop()")
    loaded_at = probe(page)["loadedAt"]

    # charts fill from the live stream, in this one page load
    first = wait_probe(page, "p.metrics >= 3 && p.drawn >= 3")
    later = wait_probe(
        page, f"p.metrics >= {first['metrics'] + 5} && p.drawn >= {first['drawn'] + 5}"
    )
    assert later["loadedAt"] == loaded_at  # no reload: the same page object got the events
    assert page.evaluate("() => performance.getEntriesByType('navigation').length") == 1
    assert page.locator(".chart").count() == 12
    assert page.locator(".chart canvas").count() == 12
    page.screenshot(path=str(artifacts / "job-page-running.png"), full_page=True)

    # change the learning rate from the page: the `config` event arrives, the metric follows
    page.fill("[id='steer-optim.lr']", "0.0001")
    page.click("#steer-apply")
    page.wait_for_selector("#steer-message:has-text('change 1 sent')")
    config = wait_probe(page, "p.configs.length >= 1")["configs"][0]
    assert config["version"] == 1 and config["changes"] == {"optim.lr": 0.0001}
    page.wait_for_selector("#configs td:has-text('optim.lr = 0.0001')")
    with httpx.Client(
        base_url=service.base_url, headers={"Authorization": f"Bearer {KEYS['alice']}"}
    ) as alice:
        wait_for(alice, job_id, lambda j: j["progress"]["step"] >= config["step"] + 2)
        rows = alice.get(f"/v1/jobs/{job_id}/metrics").json()["items"]
        assert {r["metrics"]["lr"] for r in rows if r["step"] > config["step"]} == {1e-4}

        # pause, then resume: the stream stays open and goes on after the resume
        page.click("#job-pause")
        page.wait_for_selector("#job-status:text-is('paused')", timeout=TIMEOUT_MS)
        paused = alice.get(f"/v1/jobs/{job_id}").json()
        assert paused["status"] == "paused"
        at_pause = wait_probe(page, f"p.metrics >= {paused['progress']['step']}")["metrics"]
        page.click("#job-resume")
        wait_probe(page, f"p.metrics >= {at_pause + 3}")
        page.wait_for_selector("#job-status:text-is('running')")

        # the CSV download holds a row per step so far, lr included
        with page.expect_download() as download:
            page.click("#csv")
        table = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))
        steps = [int(r["step"]) for r in table]
        assert steps == list(range(1, len(steps) + 1)) and len(steps) >= at_pause + 3
        assert float(table[-1]["lr"]) == 1e-4 and float(table[0]["lr"]) == 1e-3

        page.screenshot(path=str(artifacts / "job-page.png"), full_page=True)
        page.click("#job-cancel")
        page.wait_for_selector("#job-status:text-is('cancelled')", timeout=TIMEOUT_MS)
        done = alice.get(f"/v1/jobs/{job_id}").json()
        assert done["status"] == "cancelled"
    final = probe(page)
    assert final["metrics"] == done["progress"]["step"] == final["drawn"]
    statuses = page.locator("#log").inner_text()
    assert "pause requested" in statuses and "config change 1 requested" in statuses

    # the jobs page lists it, filtered by status
    page.goto(service.base_url + "/ui/#/jobs")
    page.select_option("#status-filter", "cancelled")
    page.wait_for_selector(f"tr[data-job='{job_id}']")


def test_a_cut_stream_reconnects_with_last_event_id_and_draws_every_step_once(
    page: Any,
    service: Service,
) -> None:
    """The page's event stream is cut twice mid-way by a proxy (only the stream: the page's
    other requests pass); it reconnects by itself after the last event it got, and ends with
    every step drawn exactly once."""
    steps = 40
    with httpx.Client(
        base_url=service.base_url, headers={"Authorization": f"Bearer {KEYS['alice']}"}
    ) as alice:
        job_id = alice.post("/v1/jobs", json=smoke_spec(steps=steps)).json()["id"]
        wait_for(alice, job_id, lambda j: j["status"] in {"succeeded", "failed"}, timeout=120)
    port = int(service.base_url.rsplit(":", 1)[1])
    cutter = StreamCutter(port, cut_after=2500, cuts=2)
    try:
        login(page, cutter.url, KEYS["alice"])
        page.wait_for_selector("#spec")
        page.goto(f"{cutter.url}/ui/#/jobs/{job_id}")
        page.wait_for_selector("#job-status:text-is('succeeded')", timeout=TIMEOUT_MS)
        done = wait_probe(page, f"p.drawn >= {steps}")
    finally:
        cutter.close()
    assert cutter.cut == 2 and done["reconnects"] == 2
    assert done["metrics"] == steps == done["drawn"]  # none twice, none missed
    assert page.evaluate("() => window.pdppoDashboard.steps") == list(range(1, steps + 1))
