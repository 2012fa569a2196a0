"""Resuming a running job's stream after the job has moved on: the events published while the
client was away come from the stored stream, the later ones live, with no gap and no duplicate
where the two meet (`api.streaming.events`: a subscriber joins the live feed, then reads the backlog
up to the feed's cursor).

`test_lifecycle.py::test_sse_resume_with_last_event_id_has_no_gap_and_no_duplicate` resumes an
ended job (the stored stream alone).
"""

from __future__ import annotations

import httpx

from tests.support.specs import smoke_spec
from tests.support.waits import metric_steps, read_events, wait_for

STEPS = 60
AWAY_STEPS = 15  # steps the job publishes while the client is disconnected


def test_resume_mid_run_gets_the_stored_events_then_the_live_ones(alice: httpx.Client) -> None:
    """Protects the resume of a running job from `Last-Event-ID`: the backlog read starting
    right after the id (not one event late or early) and its hand-over to the live feed."""
    spec = smoke_spec(steps=STEPS, checkpoint_every=20)
    spec["train"]["rollout"].update(prompts_per_step=8, group_size=8)  # slower steps
    job_id = alice.post("/v1/jobs", json=spec).json()["id"]

    # queued, running, the log of its torch threads, the phases loading model and training,
    # steps 1 and 2: then away
    first = read_events(alice, job_id, limit=7)
    assert [e["event"] for e in first] == [
        "status", "status", "log", "phase", "phase", "metrics", "metrics"
    ]  # fmt: skip
    assert first[2]["data"]["message"].startswith("torch threads: 1 per process")
    away = wait_for(alice, job_id, lambda j: j["progress"]["step"] >= 2 + AWAY_STEPS)
    assert away["status"] == "running" and away["progress"]["step"] < STEPS - 10, away
    rest = read_events(alice, job_id, last_event_id=first[-1]["id"])

    assert rest[-1] == {"id": rest[-1]["id"], "event": "done", "data": {"status": "succeeded"}}
    whole = read_events(alice, job_id)
    assert first + rest == whole
    assert metric_steps(rest) == list(range(3, STEPS + 1))
