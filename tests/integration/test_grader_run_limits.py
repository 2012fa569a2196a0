"""graders.run admitted per tenant and per API process, on the real stack (redis-server,
`pdppo serve`): a tenant at its limit gets 429 with Retry-After while another tenant's runs go on,
and every run gives its slot back when it ends."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.support.stack import Service

RUN = "/v1/fine_tuning/alpha/graders/run"
QUICK = {"type": "python", "name": "p", "source": "def grade(sample, item):\n    return 1.0\n"}


def _slow(marker: Path) -> dict[str, Any]:
    """A grader that says it started grading (the file), then takes 3 s (the deadline is 5)."""
    source = (
        "import time\n"
        "def grade(sample, item):\n"
        f"    open({str(marker)!r}, 'w').close()\n"
        "    time.sleep(3)\n"
        "    return 0.5\n"
    )
    return {"type": "python", "name": "p", "source": source}


def test_grader_runs_are_limited_per_tenant_and_one_tenant_at_its_limit_blocks_no_other(
    make_service: Callable[..., Service], tmp_path: Path
) -> None:
    service = make_service(
        PDPPO_OPENAI_PYTHON_GRADERS="true",
        PDPPO_GRADER_RUNS_MAX_PER_TENANT="1",
        PDPPO_GRADER_RUNS_MAX="2",
    )
    service.start_api()
    answers: dict[str, httpx.Response] = {}

    def run(tenant: str, grader: dict[str, Any]) -> httpx.Response:
        with service.client(tenant) as http:  # 30 s: a run takes 3
            return http.post(RUN, json={"grader": grader, "model_sample": "7"})

    def in_flight(tenant: str) -> threading.Thread:
        marker = tmp_path / tenant
        thread = threading.Thread(
            target=lambda: answers.__setitem__(tenant, run(tenant, _slow(marker)))
        )
        thread.start()
        deadline = time.monotonic() + 30
        while not marker.exists():  # its grader is grading: the run holds its slot
            assert time.monotonic() < deadline and thread.is_alive(), answers
            time.sleep(0.05)
        return thread

    quick = QUICK
    alice = in_flight("alice")
    refused = run("alice", quick)
    assert refused.status_code == 429, refused.text
    assert 1 <= int(refused.headers["Retry-After"]) <= 5
    error = refused.json()["error"]
    assert error["code"] == "rate_limit_exceeded"
    assert error["message"] == (
        "tenant 'alice' has 1 grader runs in flight, the most allowed "
        "(PDPPO_GRADER_RUNS_MAX_PER_TENANT); try again after Retry-After seconds"
    )
    bob = in_flight("bob")  # admitted while alice is at her limit
    assert alice.is_alive()
    full = run("carol", quick)  # two in flight: the server's limit
    assert full.status_code == 429, full.text
    assert full.json()["error"]["message"].startswith("this server has 2 grader runs in flight")
    alice.join(30)
    bob.join(30)
    assert {t: (r.status_code, r.json()["reward"]) for t, r in answers.items()} == {
        "alice": (200, 0.5),
        "bob": (200, 0.5),
    }
    # the slots came back: each tenant runs again, a refused run held none
    for tenant in ("alice", "carol"):
        again = run(tenant, quick)
        assert again.status_code == 200, again.text
        assert again.json()["reward"] == 1.0
