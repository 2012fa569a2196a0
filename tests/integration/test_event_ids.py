"""Event ids a client sends back (`Last-Event-ID`, `since`): bad ones are a 400 before the stream
starts, and an id past the job's newest event still gets a stream that ends with the job.

An id past the newest event means the client saw events this server does not have (a Redis
restored from an older backup, a copied id): it gets what comes after its id, and the job's
`done` whatever that one's id, so that a following client is never left hanging.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.support.specs import smoke_spec
from tests.support.stack import Service
from tests.support.waits import metric_steps, read_events, wait_for, wait_status

ID_PART_MAX = 2**64 - 1
STEPS = 300  # 10-100 ms a step here: seconds of running job to connect in


def slow_spec(steps: int) -> dict[str, Any]:
    """A job that runs long enough to connect in the middle of it."""
    spec = smoke_spec(steps=steps, checkpoint_every=0)
    spec["train"]["rollout"].update(prompts_per_step=8, group_size=8)
    return spec


def gpu_spec() -> dict[str, Any]:
    spec = smoke_spec()
    spec["resources"] = {"device": "gpu"}  # no GPU worker here: it stays queued
    return spec


def read_within(
    client: httpx.Client, job_id: str, last_event_id: str, seconds: float
) -> list[dict[str, Any]]:
    """`read_events`, failing if the stream has not ended after `seconds`: pings keep a stream
    that never ends alive, so a read timeout would not catch it (and the test would hang). Reads
    lines, pings included, so that the deadline is checked at least at every ping."""
    deadline = time.monotonic() + seconds
    out: list[dict[str, Any]] = []
    fields: dict[str, str] = {}
    headers = {"Last-Event-ID": last_event_id}
    with client.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            assert time.monotonic() < deadline, f"the stream did not end; got {out}"
            if line:
                name, _, value = line.partition(": ")
                fields[name] = value
            elif "event" in fields:
                data = json.loads(fields["data"])
                out.append({"id": fields["id"], "event": fields["event"], "data": data})
                fields = {}
            else:
                fields = {}  # the end of a ping (a comment)
    return out


def as_tuple(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)


@pytest.mark.parametrize(
    ("header", "words"),
    [
        ("yesterday", "is not an event id"),
        ("1-2-3", "is not an event id"),
        ("-5", "is not an event id"),
        ("12.5", "is not an event id"),
        (f"{ID_PART_MAX + 1}-0", "out of range"),
        (f"0-{ID_PART_MAX + 1}", "out of range"),
        (f"{ID_PART_MAX}-{ID_PART_MAX + 1}", "out of range"),
        ("9" * 21, "is not an event id"),
    ],
)
def test_bad_or_impossible_ids_are_400(
    alice: httpx.Client, service: Service, header: str, words: str
) -> None:
    job = alice.post("/v1/jobs", json=gpu_spec()).json()
    log_before = len(service.tail("api.log", 10_000_000))
    try:
        by_header = alice.get(f"/v1/jobs/{job['id']}/events", headers={"Last-Event-ID": header})
        assert by_header.status_code == 400, by_header.text
        assert by_header.json()["detail"].startswith("Last-Event-ID: ")
        assert words in by_header.json()["detail"]
        by_query = alice.get(f"/v1/jobs/{job['id']}/events", params={"since": header})
        assert by_query.status_code == 400, by_query.text
        assert by_query.json()["detail"].startswith("query.since: ")
    finally:
        alice.post(f"/v1/jobs/{job['id']}/cancel")
    assert "Traceback" not in service.tail("api.log", 10_000_000)[log_before:]


def test_ids_past_the_newest_event_get_what_follows_and_end_with_the_job(
    alice: httpx.Client, service: Service
) -> None:
    job = alice.post("/v1/jobs", json=slow_spec(steps=STEPS)).json()
    wait_for(alice, job["id"], lambda j: j["progress"]["step"] >= 2)
    # Ids are the Redis clock in ms: 1 s from now is past every event so far, and some steps
    # come after it; the far one is past every event the job will ever have, and so is the last
    # possible id, after which Redis refuses to start a range.
    near = f"{int(time.time() * 1000) + 1000}-0"
    far = "99999999999999-0"  # the year 5138
    last_possible = f"{ID_PART_MAX}-{ID_PART_MAX}"
    with ThreadPoolExecutor(3) as pool:
        reads = [
            pool.submit(read_within, alice, job["id"], i, 60) for i in (near, far, last_possible)
        ]
        got_near, got_far, got_last_possible = (read.result() for read in reads)
    assert wait_status(alice, job["id"], "succeeded")["status"] == "succeeded"
    whole = read_events(alice, job["id"])

    # The near one: every event after its id, in order, then done; nothing before it.
    steps = metric_steps(got_near)
    assert steps, "the job ended within a second of the id: make it longer"
    assert got_near == [e for e in whole if as_tuple(e["id"]) > as_tuple(near)]
    assert got_near[-1]["event"] == "done"
    assert steps[0] > 2 and steps == list(range(steps[0], STEPS + 1))
    # The far one: nothing comes after it but the job's end, which it still gets.
    assert got_far == got_last_possible == [whole[-1]] and got_far[0]["event"] == "done"

    # Once the job has ended: an id past its `done` gets the `done` at once; the `done`'s own
    # id gets nothing (that client has seen the end).
    started = time.monotonic()
    assert read_within(alice, job["id"], far, 10) == [whole[-1]]
    assert read_within(alice, job["id"], last_possible, 10) == [whole[-1]]
    done_ms, done_seq = as_tuple(whole[-1]["id"])
    just_past = f"{done_ms}-{done_seq + 1}"
    assert read_within(alice, job["id"], just_past, 10) == [whole[-1]]
    assert read_within(alice, job["id"], whole[-1]["id"], 10) == []
    assert time.monotonic() - started < 5
    assert "Traceback" not in service.tail("api.log", 1_000_000)


def test_since_query_resumes_like_last_event_id(alice: httpx.Client) -> None:
    job = alice.post("/v1/jobs", json=smoke_spec()).json()
    whole = read_events(alice, job["id"])
    middle = whole[len(whole) // 2]["id"]
    with alice.stream("GET", f"/v1/jobs/{job['id']}/events", params={"since": middle}) as r:
        assert r.status_code == 200
        body = r.read().decode()
    ids = [line[4:] for line in body.splitlines() if line.startswith("id: ")]
    assert ids == [e["id"] for e in whole if as_tuple(e["id"]) > as_tuple(middle)]
