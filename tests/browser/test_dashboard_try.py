"""The prompt box on a job's dashboard page: shown for a succeeded job only, it posts to
`POST /v1/jobs/{id}/completions` (answered by `pdppo sample-worker`) and shows the completion,
or the server's reason when it refuses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from tests.browser.dashboard import login
from tests.support.specs import smoke_spec
from tests.support.stack import KEYS, Service
from tests.support.waits import wait_for

TIMEOUT_MS = 60_000


def test_a_succeeded_jobs_page_tries_its_model(
    page: Any, make_service: Callable[..., Service]
) -> None:
    svc = make_service()
    svc.start_api()
    svc.start_worker("cpu")
    svc.start_sample_worker()
    with httpx.Client(
        base_url=svc.base_url, headers={"Authorization": f"Bearer {KEYS['alice']}"}, timeout=60
    ) as alice:
        done = alice.post("/v1/jobs", json=smoke_spec(steps=2)).json()["id"]
        wait_for(alice, done, lambda j: j["status"] == "succeeded", timeout=120)
        body = {"prompt": "12=", "max_tokens": 6, "temperature": 0}
        expected = alice.post(f"/v1/jobs/{done}/completions", json=body).json()
        running = alice.post("/v1/jobs", json=smoke_spec(steps=5000, checkpoint_every=0)).json()[
            "id"
        ]
        wait_for(alice, running, lambda j: j["status"] == "running")
        login(page, svc.base_url, KEYS["alice"])
        page.wait_for_selector("#spec")

        page.goto(f"{svc.base_url}/ui/#/jobs/{running}")
        page.wait_for_selector("#job-status:has-text('running')", timeout=TIMEOUT_MS)
        assert page.is_hidden("#job-try")
        alice.post(f"/v1/jobs/{running}/cancel")

    page.goto(f"{svc.base_url}/ui/#/jobs/{done}")
    page.wait_for_selector("#job-try #try-prompt", timeout=TIMEOUT_MS)
    assert page.inner_text("#job-try h2") == "Try the model"
    page.fill("#try-prompt", "12=")
    page.fill("#try-max-tokens", "6")
    page.fill("#try-temperature", "0")
    page.click("#try-send")
    shown = page.wait_for_selector(".try-answer", timeout=TIMEOUT_MS)
    choice = expected["choices"][0]
    assert shown.inner_text() == choice["text"]
    assert shown.get_attribute("data-finish") == choice["finish_reason"]
    assert page.inner_text("#try-message").startswith(f"{choice['tokens']} tokens in ")

    page.fill("#try-max-tokens", "1000")  # past PDPPO_SAMPLE_MAX_TOKENS (256)
    page.click("#try-send")
    page.wait_for_selector("#try-message.error", timeout=TIMEOUT_MS)
    assert page.inner_text("#try-message") == "max_tokens: at most 256 (PDPPO_SAMPLE_MAX_TOKENS)"
