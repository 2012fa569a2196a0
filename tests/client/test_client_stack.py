"""The Python client against the real stack: submit, follow to the end, resume a dropped
stream, cancel, list, metrics, checkpoints, errors."""

from __future__ import annotations

import tarfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from pdppo.client import ApiError, Client
from tests.client.jobs import TENANT, FinishedJob
from tests.client.proxy import DroppingProxy
from tests.support.specs import parked_spec, smoke_spec
from tests.support.stack import KEYS, Service

LONG = {"steps": 5000, "checkpoint_every": 0}  # only a cancel ends it


def _steps(events: list) -> list[int]:  # type: ignore[type-arg]
    return [e.json()["step"] for e in events if e.event == "metrics"]


def test_submit_and_follow_to_the_end(finished_job: FinishedJob, client: Client) -> None:
    events = finished_job.events
    assert events[-1].event == "done" and events[-1].json() == {"status": "succeeded"}
    assert [e.json()["status"] for e in events if e.event == "status"] == [
        "queued",
        "running",
        "succeeded",
    ]
    assert _steps(events) == [1, 2, 3, 4]
    ids = [e.id for e in events]
    assert all(ids) and len(set(ids)) == len(ids)

    job = client.get(finished_job.id)
    assert job.status == "succeeded" and job.done
    assert (job.progress.step, job.progress.total) == (4, 4)
    assert job.name == "finished" and job.spec["train"]["steps"] == 4
    assert job.metrics is not None and "reward_mean" in job.metrics

    rows = client.metrics(finished_job.id)
    sse = [e.json()["metrics"] for e in events if e.event == "metrics"]
    assert [r.step for r in rows] == [1, 2, 3, 4]
    assert [r.metrics for r in rows] == sse
    csv_lines = client.metrics_csv(finished_job.id).strip().splitlines()
    assert csv_lines[0].startswith("step") and len(csv_lines) == 5


def test_checkpoints_and_downloads(
    finished_job: FinishedJob, client: Client, tmp_path: Path
) -> None:
    listing = client.checkpoints(finished_job.id)
    assert [c.step for c in listing.items] == [2, 4]
    assert listing.final_model_url is not None
    newest = client.download(finished_job.id, listing.items[-1].name, tmp_path)
    final = client.download(finished_job.id, "final", tmp_path / "final.tar")
    for path in (newest, final):
        assert tarfile.is_tarfile(path), path
        assert not path.with_name(path.name + ".part").exists()
    with pytest.raises(ApiError) as missing:
        client.download(finished_job.id, "step-999999", tmp_path)
    assert missing.value.status_code == 404


def test_follow_from_an_event_id_yields_exactly_the_rest(
    finished_job: FinishedJob, client: Client
) -> None:
    ids = [e.id for e in finished_job.events]
    for k in (0, len(ids) // 2, len(ids) - 2):
        rest = list(client.follow(finished_job.id, last_event_id=ids[k]))
        assert [e.id for e in rest] == ids[k + 1 :]


def test_follow_survives_dropped_connections_without_gap_or_duplicate(
    service: Service, client: Client
) -> None:
    target = urlsplit(service.base_url)
    # The first two connections are cut mid-response (a metrics event is ~600 bytes, so each cut
    # falls a few events in, while the job is still running); the third one lives.
    cuts = [1500, 1500]
    proxy = DroppingProxy(target.hostname or "127.0.0.1", target.port or 80, cut_after=cuts)
    job = client.submit(smoke_spec(steps=12, checkpoint_every=0) | {"name": "dropped"})
    try:
        with Client(proxy.url, KEYS[TENANT], reconnect_delay=0.1) as via_proxy:
            seen = list(via_proxy.follow(job.id))
    finally:
        proxy.close()
    assert (proxy.cuts, proxy.accepted) == (2, 3)
    assert seen[-1].event == "done" and seen[-1].json()["status"] == "succeeded"
    assert _steps(seen) == list(range(1, 13))
    replay = list(client.follow(job.id))  # the stream as the server kept it
    assert [e.id for e in seen] == [e.id for e in replay]
    assert [e.data for e in seen] == [e.data for e in replay]


def test_cancel_running_and_queued_jobs(client: Client) -> None:
    running = client.submit(smoke_spec(**LONG) | {"name": "long"})
    parked = client.submit(parked_spec())

    cancelled = client.cancel(parked.id)
    assert cancelled.status == "cancelled"  # never started: cancelled on the spot

    events = client.follow(running.id)
    for event in events:
        if event.event == "metrics":
            break  # it is training now
    asked = client.cancel(running.id)
    assert asked.cancel_requested and asked.status == "running"
    rest = list(events)
    assert rest[-1].event == "done" and rest[-1].json() == {"status": "cancelled"}
    final = client.get(running.id)
    assert final.status == "cancelled" and final.progress.step < 5000
    assert [e.json()["status"] for e in client.follow(parked.id) if e.event == "status"] == [
        "queued",
        "cancelled",
    ]
    with pytest.raises(ApiError) as again:
        client.cancel(running.id)
    assert again.value.status_code == 409


def test_list_pages_filters_and_idempotency(finished_job: FinishedJob, client: Client) -> None:
    first = client.submit(parked_spec("list-a"), idempotency_key="client-list-a")
    retried = client.submit(parked_spec("list-a"), idempotency_key="client-list-a")
    second = client.submit(parked_spec("list-b"))
    try:
        assert retried.id == first.id

        page = client.list(limit=1)
        assert [j.id for j in page.items] == [second.id] and page.next_cursor
        following = client.list(limit=1, cursor=page.next_cursor)
        assert [j.id for j in following.items] == [first.id]

        everything = [j.id for j in client.iter_jobs(page_size=2)]
        assert everything.index(second.id) < everything.index(first.id)
        assert everything.index(first.id) < everything.index(finished_job.id)
        assert len(everything) == len(set(everything))

        queued = {j.id for j in client.list(status="queued", limit=100).items}
        assert {first.id, second.id} <= queued
        succeeded = client.list(status="succeeded", limit=100).items
        assert finished_job.id in {j.id for j in succeeded}
        assert all(j.status == "succeeded" for j in succeeded)
    finally:
        client.cancel(first.id)
        client.cancel(second.id)


def test_errors_carry_status_and_detail(service: Service, client: Client) -> None:
    with pytest.raises(ApiError) as invalid:
        client.submit(smoke_spec(steps=0))
    assert invalid.value.status_code == 422
    assert "train.steps" in str(invalid.value)

    with pytest.raises(ApiError) as missing:
        client.get("0123456789")
    assert missing.value.status_code == 404

    with Client(service.base_url, "not-a-key") as stranger, pytest.raises(ApiError) as denied:
        stranger.list()
    assert denied.value.status_code == 401
    assert denied.value.detail == "missing or invalid API key"
    assert client.health()
