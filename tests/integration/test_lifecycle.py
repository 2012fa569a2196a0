"""A job end to end: submit, watch over SSE, read its metrics, checkpoints and final model."""

from __future__ import annotations

import csv
import io
import tarfile
import time

import httpx

from tests.support.specs import smoke_spec
from tests.support.stack import Service
from tests.support.waits import TERMINAL, metric_steps, read_events, wait_status


def test_submit_runs_to_success_with_a_metrics_event_per_step(alice: httpx.Client) -> None:
    created = alice.post("/v1/jobs", json=smoke_spec())
    assert created.status_code == 201, created.text
    job = created.json()
    assert job["status"] == "queued"
    assert job["progress"] == {"step": 0, "total": 8}
    assert job["spec"]["train"]["steps"] == 8

    events = read_events(alice, job["id"])  # from the first event to `done`

    statuses = [e["data"]["status"] for e in events if e["event"] == "status"]
    assert statuses == ["queued", "running", "succeeded"]
    assert metric_steps(events) == list(range(1, 9))
    assert events[-1] == {"id": events[-1]["id"], "event": "done", "data": {"status": "succeeded"}}
    ids = [e["id"] for e in events]
    assert len(set(ids)) == len(ids) and all(ids)
    assert any(e["event"] == "checkpoint" for e in events)
    assert all("loss" in e["data"]["metrics"] for e in events if e["event"] == "metrics")

    final = alice.get(f"/v1/jobs/{job['id']}").json()
    assert final["status"] == "succeeded"
    assert final["progress"] == {"step": 8, "total": 8}
    assert final["started_at"] and final["finished_at"]
    assert final["error"] is None and "loss" in final["metrics"]

    history = alice.get(f"/v1/jobs/{job['id']}/metrics").json()
    assert [row["step"] for row in history["items"]] == list(range(1, 9))
    sse_metrics = [e["data"]["metrics"] for e in events if e["event"] == "metrics"]
    assert [row["metrics"] for row in history["items"]] == sse_metrics

    as_csv = alice.get(f"/v1/jobs/{job['id']}/metrics", params={"format": "csv"})
    assert as_csv.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(as_csv.text)))
    assert [int(r["step"]) for r in rows] == list(range(1, 9))
    assert float(rows[0]["loss"]) == sse_metrics[0]["loss"]


def test_checkpoints_and_final_model_download(alice: httpx.Client) -> None:
    job = alice.post("/v1/jobs", json=smoke_spec()).json()
    wait_status(alice, job["id"], "succeeded")

    listing = alice.get(f"/v1/jobs/{job['id']}/checkpoints").json()
    assert [c["step"] for c in listing["items"]] == [6, 8]  # keep_checkpoints: 2
    newest = listing["items"][-1]
    blob = alice.get(newest["download_url"])
    assert blob.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(blob.content)) as tar:
        names = tar.getnames()
    assert f"{newest['name']}/meta.json" in names

    model = alice.get(listing["final_model_url"])
    assert model.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(model.content)) as tar:
        assert any(name.startswith("final/") for name in tar.getnames())

    missing = alice.get(f"/v1/jobs/{job['id']}/checkpoints/step-999999")
    assert missing.status_code == 404
    traversal = alice.get(f"/v1/jobs/{job['id']}/checkpoints/..%2F..%2Fetc")
    assert traversal.status_code == 404


def test_sse_resume_with_last_event_id_has_no_gap_and_no_duplicate(alice: httpx.Client) -> None:
    """Protects resuming from stored events (`api.streaming.events` backlog after `Last-Event-ID`):
    the client reconnects only after the job has published the rest of its events and ended, so
    every event it gets comes from the stored stream; one resumed a frame late (or early)
    misses (or repeats) an event here. `test_sse_resume_stored.py` resumes a running job."""
    job = alice.post("/v1/jobs", json=smoke_spec(steps=40, checkpoint_every=10)).json()

    first = read_events(alice, job["id"], limit=5)  # then drop the connection
    assert wait_status(alice, job["id"], TERMINAL)["status"] == "succeeded"
    rest = read_events(alice, job["id"], last_event_id=first[-1]["id"])
    assert rest[-1]["event"] == "done"

    whole = read_events(alice, job["id"])  # the full history, after the fact
    assert [e["id"] for e in first + rest] == [e["id"] for e in whole]
    assert first + rest == whole
    assert metric_steps(first + rest) == list(range(1, 41))


def test_reconnect_after_done_ends_at_once(alice: httpx.Client) -> None:
    job = alice.post("/v1/jobs", json=smoke_spec()).json()
    events = read_events(alice, job["id"])
    assert read_events(alice, job["id"], last_event_id=events[-1]["id"], timeout=10) == []
    tail = read_events(alice, job["id"], last_event_id=events[-3]["id"])
    assert tail == events[-2:]


def test_a_missing_dataset_fails_the_job_with_code_and_message(
    alice: httpx.Client, service: Service
) -> None:
    missing = f"{service.data_dir}/nonexistent/data.jsonl"  # allowed, but not there
    spec = smoke_spec()
    spec["train"]["task"] = {"name": "jsonl", "path": missing}
    job = alice.post("/v1/jobs", json=spec).json()
    events = read_events(alice, job["id"])
    assert events[-1]["data"] == {"status": "failed"}
    failed = alice.get(f"/v1/jobs/{job['id']}").json()
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "invalid_input"
    assert failed["error"]["message"] == (
        f"UnsafeFileError: task.path={missing!r} cannot be read (No such file or directory)"
    )
    assert "traceback" not in failed["error"]  # the worker's log and the record keep it
    assert alice.post(f"/v1/jobs/{job['id']}/cancel").status_code == 409


def test_idle_stream_gets_pings_and_proxy_headers(alice: httpx.Client) -> None:
    spec = smoke_spec()
    spec["resources"] = {"device": "gpu"}  # no GPU worker here: the job waits, the stream idles
    job = alice.post("/v1/jobs", json=spec).json()
    try:
        lines: list[str] = []
        started = time.monotonic()
        with alice.stream("GET", f"/v1/jobs/{job['id']}/events") as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            assert response.headers["x-accel-buffering"] == "no"
            for line in response.iter_lines():
                lines.append(line)
                if sum(line.startswith(": ping") for line in lines) >= 2:
                    break
        assert time.monotonic() - started < 10  # PDPPO_SSE_PING_SECONDS=1 in the test service
        assert "event: status" in lines and 'data: {"status": "queued"' in "\n".join(lines)
    finally:
        alice.post(f"/v1/jobs/{job['id']}/cancel")
