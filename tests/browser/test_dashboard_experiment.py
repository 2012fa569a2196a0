"""An experiment on the dashboard: linked from the jobs list, its page draws each arm's median
curve with its min-max band over seeds and the report table, and its buttons act on every child."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.browser.dashboard import login
from tests.support.specs import smoke_spec
from tests.support.stack import KEYS, Service

TIMEOUT_MS = 120_000


def test_the_experiment_page_draws_arms_and_the_report(
    page: Any, service: Service, artifacts: Path
) -> None:
    base = smoke_spec(steps=3)
    base["train"]["task"] |= {"warmup_steps": 20, "warmup_target": "answer"}  # rewards above 0
    body = {
        "name": "browser",
        "base": base,
        "grid": {"algorithm.mask": ["predictive", "dppo"]},
        "seeds": 2,
    }
    with httpx.Client(
        base_url=service.base_url, headers={"Authorization": f"Bearer {KEYS['alice']}"}
    ) as alice:
        exp = alice.post("/v1/experiments", json=body).json()
    login(page, service.base_url, KEYS["alice"])
    link = page.wait_for_selector(f"#experiments [data-experiment='{exp['id']}'] a")
    assert link.inner_text() == "browser"
    link.click()
    page.wait_for_function(
        "() => window.pdppoExperiment.status === 'succeeded'", timeout=TIMEOUT_MS
    )
    page.wait_for_function("() => window.pdppoExperiment.reportRows === 2", timeout=TIMEOUT_MS)
    drawn = page.evaluate("() => ({...window.pdppoExperiment})")
    assert drawn["arms"] == ["mask=predictive", "mask=dppo"]
    assert drawn["steps"] == 3 and drawn["bands"] == 2
    rows = page.query_selector_all("#report tbody tr")
    assert [r.get_attribute("data-arm") for r in rows] == ["mask=predictive", "mask=dppo"]
    assert "baseline" in rows[0].inner_text()
    assert page.inner_text("#report caption") == "paired seeds: 0, 1"
    assert page.inner_text("#experiment-status") == "succeeded"
    assert len(page.query_selector_all("#experiment-runs li a")) == 4
    page.screenshot(path=str(artifacts / "experiment-page.png"), full_page=True)

    page.select_option("#experiment-baseline", "mask=dppo")
    page.click("#experiment-update")
    page.wait_for_function(
        "() => document.querySelector(\"#report tr[data-arm='mask=dppo']\").innerText"
        ".includes('baseline')"
    )
    page.click("[data-action=delete]")
    page.wait_for_selector("#jobs")
    with httpx.Client(
        base_url=service.base_url, headers={"Authorization": f"Bearer {KEYS['alice']}"}
    ) as alice:
        assert alice.get(f"/v1/experiments/{exp['id']}").status_code == 404
