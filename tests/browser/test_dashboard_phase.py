"""A job's phase while it runs and its warnings once it has ended, end to end: the worker
reports them, the API serves them (`phase`, `warnings` on the job, `phase` events on its
stream), and the dashboard shows them in the jobs list and on the job's page.

Needs the server side of issue 36 (`Job.phase`, `Job.warnings`, the `phase` event): until that
is in, this test fails (no phase ever shows). How the page renders given records is checked on
its own in test_dashboard_charts.py."""

from __future__ import annotations

import re
from typing import Any

import httpx

from tests.browser.dashboard import login, wait_probe
from tests.browser.never_matching import submit_never_matching
from tests.support.stack import KEYS, Service
from tests.support.waits import wait_for

PHASE = r"^(loading model|warm-up|training|evaluating|saving)( \d+(/\d+)?)?$"
TIMEOUT_MS = 60_000


def test_the_phase_shows_while_it_runs_and_the_warnings_once_it_ended(
    page: Any, service: Service
) -> None:
    steps = 800  # about 10 s of training on one core: long enough to be seen running
    login(page, service.base_url, KEYS["alice"])
    page.wait_for_selector("#spec")
    with httpx.Client(
        base_url=service.base_url, headers={"Authorization": f"Bearer {KEYS['alice']}"}
    ) as alice:
        job_id = submit_never_matching(alice, steps)

        # the jobs list: the running job's phase next to its status
        page.wait_for_function(
            "([id, pattern]) => { const phase = document.querySelector("
            "`tr[data-job='${id}'] .phase`); return phase && new RegExp(pattern)"
            ".test(phase.textContent); }",
            arg=[job_id, PHASE],
            timeout=TIMEOUT_MS,
        )

        # its page: the phase follows the stream's `phase` events, then the warnings show
        page.goto(f"{service.base_url}/ui/#/jobs/{job_id}")
        wait_probe(page, "p.phases.length >= 1", TIMEOUT_MS)
        # training's count moves on with the steps, on screen (not only at a reload)
        page.wait_for_function(
            """(total) => {
              const text = document.querySelector("#job-phase").textContent;
              const seen = text.match(new RegExp(`^training ([0-9]+)/${total}$`));
              if (!seen) return false;
              window.firstTrainingStep ??= Number(seen[1]);
              return Number(seen[1]) > window.firstTrainingStep;
            }""",
            arg=steps,
            timeout=TIMEOUT_MS,
        )
        page.wait_for_selector("#job-status:text-is('succeeded')", timeout=TIMEOUT_MS)
        job = wait_for(alice, job_id, lambda j: j["status"] == "succeeded")

    assert job["phase"] is None
    assert {w["code"] for w in job["warnings"]} == {"no_reward_variance", "rewards_all_zero"}
    phases = wait_probe(page, "true")["phases"]
    assert all(re.match(PHASE, p) for p in phases), phases
    names = [m.group(1) for p in phases if (m := re.match(PHASE, p))]
    assert [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n] == [
        "loading model",
        "training",
        "saving",
    ]
    assert page.inner_text("#job-phase") == ""
    badge = page.wait_for_selector("#job-warnings .badge")
    assert badge.inner_text() == "⚠ 2 warnings"
    assert badge.get_attribute("title") == "\n".join(w["message"] for w in job["warnings"])
    listed = page.eval_on_selector_all(
        "#job-warning-list li", "(items) => items.map((li) => li.textContent)"
    )
    assert listed == [f"{w['code']}: {w['message']}" for w in job["warnings"]]

    # and the jobs list: no phase any more, the warnings badge
    page.goto(f"{service.base_url}/ui/#/jobs")
    row = page.wait_for_selector(f"tr[data-job='{job_id}'] .badge")
    assert row.inner_text() == "⚠ 2 warnings"
    assert page.inner_text(f"tr[data-job='{job_id}'] .phase") == ""
