"""A job of two devices grades on both ranks, and the service counts both ranks' grading.

Each rank grades its own share of every step (`workers.job.ranks`): the step metrics were the
whole batch's already, but the service's counters (`pdppo_grading_*_total`) counted rank 0's
share only, half of them. The grader here is a python grader that raises on the rows marked
`bad` (half of them): the counters must hold every completion of every rank, and exactly the
errors the steps' `grader_errors` say."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.support.specs import smoke_spec
from tests.support.stack import TWO_DEVICES, Service
from tests.support.waits import wait_status

STEPS, PROMPTS, GROUP = 3, 4, 4
SOURCE = (
    "def grade(sample, item):\n"
    "    if item.get('bad'):\n"
    "        raise ValueError('row ' + item['prompt'] + ' is marked bad')\n"
    "    return 0.5\n"
)


def grading_counts(client: httpx.Client) -> dict[str, float]:
    """The service's grading counters, as `/metrics` has them."""
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        if sample.name.startswith("pdppo_grading_")
    }


def test_every_ranks_grading_is_counted(make_service: Callable[..., Service]) -> None:
    svc = make_service(**TWO_DEVICES, PDPPO_OPENAI_PYTHON_GRADERS="true")
    svc.start_api()
    svc.start_worker("cpu")
    rows = "".join(
        json.dumps({"prompt": f"copy {i:03d}=", "answer": f"{i:03d}", "bad": i % 2 == 0}) + "\n"
        for i in range(20)
    )
    with svc.client("alice") as alice, svc.client(None) as anonymous:
        uploaded = alice.post("/v1/files", files={"file": ("rows.jsonl", rows.encode())})
        assert uploaded.status_code == 201, uploaded.text
        spec = smoke_spec(steps=STEPS)
        spec["resources"]["gpus"] = 2
        spec["train"]["rollout"].update(prompts_per_step=PROMPTS, group_size=GROUP)
        grader = {"type": "openai", "grader": {"type": "python", "name": "p", "source": SOURCE}}
        spec["train"]["task"] = {"name": "jsonl", "file": uploaded.json()["id"], "grader": grader}
        created = alice.post("/v1/jobs", json=spec)
        assert created.status_code == 201, created.text
        job = wait_status(alice, created.json()["id"], {"succeeded", "failed"}, timeout=300)
        assert job["status"] == "succeeded", (job, svc.worker_log()[-3000:])
        steps = alice.get(f"/v1/jobs/{job['id']}/metrics").json()["items"]
        errors = round(sum(row["metrics"]["grader_errors"] * PROMPTS * GROUP for row in steps))
        assert [row["step"] for row in steps] == [1, 2, 3]
        assert 0 < errors < STEPS * PROMPTS * GROUP  # both kinds of row were drawn
        counted = grading_counts(anonymous)
    # the job's last events (its last step's counts among them) are in Redis before its end
    assert counted == {
        "pdppo_grading_completions_total": STEPS * PROMPTS * GROUP,
        "pdppo_grading_errors_total": errors,
        "pdppo_grading_timeouts_total": 0,
    }
