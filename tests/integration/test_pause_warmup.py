"""A pause, or a worker shutdown, during a job's supervised warm-up, through the service (real
Redis, Celery worker and API): the warm-up steps done are checkpointed, the resumed job continues
the warm-up from there (no warm-up step twice) and ends with the weights of a job that was never
paused."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
import torch
from safetensors.torch import load_file

from tests.support.specs import smoke_spec
from tests.support.stack import Service
from tests.support.waits import metric_steps, read_events, wait_for, wait_status

WARMUP = 1000  # ~10 ms a step on one busy CPU core: seconds of warm-up to pause in
TERMINAL = {"succeeded", "failed", "cancelled"}


def warmup_spec() -> dict[str, Any]:
    spec = smoke_spec(steps=4, checkpoint_every=50)
    spec["train"]["task"]["warmup_steps"] = WARMUP
    return spec


def into_warmup(client: httpx.Client, job_id: str) -> None:
    """Until the job reports warm-up steps done, far from its end (its phase: a fixed sleep
    after `running` was not always enough on a loaded CI machine)."""
    wait_for(client, job_id, lambda j: (j.get("phase") or {}).get("name") == "warm-up"
             and 10 <= j["phase"]["done"] < WARMUP // 2)  # fmt: skip


def logs(events: list[dict[str, Any]]) -> list[str]:
    return [e["data"]["message"] for e in events if e["event"] == "log"]


def warmed_up_once(said: list[str]) -> None:
    """The job's log says it stopped once during the warm-up, after k of its steps, resumed at
    warm-up step k and finished the warm-up once in all: k steps before, the rest after."""
    stops = [m for m in said if m.startswith("stopped during the warm-up")]
    assert len(stops) == 1, said
    found = re.fullmatch(
        rf"stopped during the warm-up after step (\d+)/{WARMUP}; checkpointed: a resumed run "
        rf"continues the warm-up at step (\d+)/{WARMUP}",
        stops[0],
    )
    assert found is not None and 0 < int(found[1]) < WARMUP, stops
    k = int(found[1])
    assert int(found[2]) == k + 1
    resumed = [m for m in said if m.startswith("resumed from")]
    assert len(resumed) == 1 and resumed[0].endswith(f"after warm-up step {k}/{WARMUP}"), said
    finished = [m for m in said if m.startswith("format warm-up: ")]
    assert len(finished) == 1 and finished[0].startswith(
        f"format warm-up: {WARMUP} steps ({k} of them before the resume)"
    ), said


def test_a_job_paused_during_its_warm_up_resumes_it_where_it_stopped(
    service: Service, alice: httpx.Client
) -> None:
    whole = alice.post("/v1/jobs", json=warmup_spec()).json()
    assert wait_status(alice, whole["id"], TERMINAL, timeout=120)["status"] == "succeeded"

    job = alice.post("/v1/jobs", json=warmup_spec()).json()
    into_warmup(alice, job["id"])
    asked = alice.post(f"/v1/jobs/{job['id']}/pause")
    assert asked.status_code == 202 and asked.json()["pause_requested"] is True, asked.text
    paused = wait_status(alice, job["id"], {"paused", *TERMINAL}, timeout=30)
    assert paused["status"] == "paused" and paused["progress"]["step"] == 0, paused
    checkpoints = alice.get(f"/v1/jobs/{job['id']}/checkpoints").json()["items"]
    assert [c["step"] for c in checkpoints] == [0]

    resumed = alice.post(f"/v1/jobs/{job['id']}/resume")
    assert resumed.status_code == 202, resumed.text
    done = wait_status(alice, job["id"], TERMINAL, timeout=120)
    assert done["status"] == "succeeded", done

    events = read_events(alice, job["id"])
    assert metric_steps(events) == [1, 2, 3, 4]
    said = logs(events)
    assert (
        "pause requested; the job stops at the next step boundary (or warm-up step), "
        "checkpoints there and releases its worker; resume continues from there"
    ) in said
    warmed_up_once(said)
    statuses = [e["data"]["status"] for e in events if e["event"] == "status"]
    assert statuses == ["queued", "running", "paused", "queued", "running", "succeeded"]

    a = load_file(str(service.artifact_dir / whole["id"] / "final" / "model.safetensors"))
    b = load_file(str(service.artifact_dir / job["id"] / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def test_a_worker_shut_down_during_the_warm_up_hands_back_its_progress(
    make_service: Callable[..., Service],
) -> None:
    svc = make_service()
    svc.start_api()
    first = svc.start_worker()
    with svc.client("alice") as alice:
        job = alice.post("/v1/jobs", json=warmup_spec()).json()
        into_warmup(alice, job["id"])
        first.terminate()  # SIGTERM, as `docker stop` sends
        assert first.wait(20) == 0, svc.worker_log(0)[-2000:]
        handed = alice.get(f"/v1/jobs/{job['id']}").json()
        assert handed["status"] == "queued" and handed["progress"]["step"] == 0, handed
        points = alice.get(f"/v1/jobs/{job['id']}/checkpoints").json()["items"]
        assert [c["step"] for c in points] == [0]

        svc.start_worker()
        done = wait_status(alice, job["id"], TERMINAL, timeout=120)
        assert done["status"] == "succeeded" and done["attempts"] == 2, done
        events = read_events(alice, job["id"])
        assert metric_steps(events) == [1, 2, 3, 4]
        warmed_up_once(logs(events))
