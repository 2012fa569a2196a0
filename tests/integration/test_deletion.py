"""Deleting jobs and files, the tenant's usage and its storage quota, on the real stack.

A job that ran (checkpoints, a final model, a link to an upload) is deleted with everything it
kept; jobs that have not ended, or that another job starts from, are refused with 409; a file an
active job names is refused too, and two tenants holding the same bytes delete only their own
copy. `GET /v1/usage` is checked to the byte, and the quota refuses uploads and jobs with 507."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import redis

from pdppo.store.keys import events_key, job_key, lease_key, metrics_key
from tests.support.files import file_id, upload
from tests.support.inprocess import native
from tests.support.specs import jsonl_spec, records, smoke_spec
from tests.support.stack import Service
from tests.support.waits import wait_status

TERMINAL = {"succeeded", "failed", "cancelled"}


def parked(spec: dict[str, Any]) -> dict[str, Any]:
    """No GPU worker runs in the tests: a gpu job stays queued until cancelled."""
    return {**spec, "resources": {"device": "gpu"}}


def delete_ended(client: httpx.Client, job_id: str, timeout: float = 30) -> httpx.Response:
    """DELETE, waiting out the moment between the job's end and its worker letting go (409
    with Retry-After)."""
    deadline = time.monotonic() + timeout
    while True:
        response = client.delete(f"/v1/jobs/{job_id}")
        if response.status_code != 409 or "Retry-After" not in response.headers:
            return response
        assert "still finishing" in response.json()["detail"]
        assert time.monotonic() < deadline, response.text
        time.sleep(0.2)


def test_deleting_a_job_removes_everything_it_kept(
    service: Service, alice: httpx.Client, bob: httpx.Client
) -> None:
    data = records(24, "del")
    file = upload(alice, data).json()["id"]
    spec = jsonl_spec(file)
    spec["train"]["checkpoint_every"] = 1
    made = alice.post("/v1/jobs", json=spec)
    assert made.status_code == 201, made.text
    job = made.json()["id"]
    done = wait_status(alice, job, TERMINAL, timeout=180)
    assert done["status"] == "succeeded", (done, service.worker_log()[-3000:])
    folder = service.artifact_dir / job
    assert {"checkpoints", "final", "inputs"} <= {p.name for p in folder.iterdir()}

    # another tenant cannot see it, let alone delete it
    assert bob.delete(f"/v1/jobs/{job}").status_code == 404
    # a queued job starting from its final model keeps it
    user = alice.post("/v1/jobs", json=parked(smoke_spec(model={"name": f"job:{job}"})))
    assert user.status_code == 201, user.text
    refused = delete_ended(alice, job)
    assert refused.status_code == 409
    assert refused.json()["detail"] == (
        f"job {job!r} is the model (train.model.name 'job:{job}') of active jobs "
        f"{user.json()['id']}; delete it once they have ended"
    )
    assert alice.post(f"/v1/jobs/{user.json()['id']}/cancel").status_code == 202

    deleted = delete_ended(alice, job)
    assert deleted.status_code == 204, deleted.text
    assert deleted.content == b""
    assert alice.get(f"/v1/jobs/{job}").status_code == 404
    assert alice.get(f"/v1/jobs/{job}/events").status_code == 404
    assert alice.delete(f"/v1/jobs/{job}").status_code == 404
    assert job not in [
        j["id"] for j in alice.get("/v1/jobs", params={"limit": 100}).json()["items"]
    ]
    assert not folder.exists()
    store = redis.Redis.from_url(service.redis_url)
    try:
        assert store.exists(job_key(job), events_key(job), metrics_key(job)) == 0
        assert store.zcard("pdppo:purge") == 0
    finally:
        store.close()
    # the upload is the tenant's still: only the job's link to it went
    assert alice.get(f"/v1/files/{file}/content").content == data
    assert alice.delete(f"/v1/files/{file}").status_code == 200
    alice.delete(f"/v1/jobs/{user.json()['id']}")


def test_a_job_that_has_not_ended_is_not_deleted(service: Service, alice: httpx.Client) -> None:
    job = alice.post("/v1/jobs", json=parked(smoke_spec())).json()["id"]
    refused = alice.delete(f"/v1/jobs/{job}")
    assert refused.status_code == 409
    assert refused.json() == {
        "detail": (
            f"job {job!r} is queued; only an ended job can be deleted: cancel it first "
            f"(pdppo cancel {job})"
        )
    }
    assert alice.get(f"/v1/jobs/{job}").json()["status"] == "queued"
    alice.post(f"/v1/jobs/{job}/cancel")
    # ended, but a worker holds it still (it gives its lease up after its last writes)
    store = redis.Redis.from_url(service.redis_url)
    try:
        store.set(lease_key(job), "worker-1:token")
        leased = alice.delete(f"/v1/jobs/{job}")
        assert (leased.status_code, leased.headers.get("Retry-After")) == (409, "5")
        assert leased.json() == {
            "detail": f"job {job!r} has ended but its worker is still finishing it; try again"
        }
        store.delete(lease_key(job))
    finally:
        store.close()
    assert alice.delete(f"/v1/jobs/{job}").status_code == 204
    assert alice.get(f"/v1/jobs/{job}").status_code == 404


def test_a_file_an_active_job_names_is_kept_and_tenants_delete_only_their_copy(
    service: Service, alice: httpx.Client, bob: httpx.Client
) -> None:
    data = records(12, "shared")
    assert upload(alice, data).status_code == 201
    assert upload(bob, data).status_code == 201  # the same bytes: the same id, two copies
    fid = file_id(data)
    mine = alice.post("/v1/jobs", json=parked(jsonl_spec(fid))).json()["id"]

    refused = alice.delete(f"/v1/files/{fid}")
    assert refused.status_code == 409
    assert native(refused) == {
        "detail": (
            f"file {fid!r} is named by jobs that have not ended: {mine}; delete it once they "
            "have ended (or cancel them)"
        )
    }
    # bob's copy is not alice's job's business, and deleting it leaves alice's alone
    assert bob.delete(f"/v1/files/{fid}").status_code == 200
    assert bob.get(f"/v1/files/{fid}").status_code == 404
    assert alice.get(f"/v1/files/{fid}/content").content == data
    sha = hashlib.sha256(data).hexdigest()
    assert not (service.artifact_dir / "files" / "bob" / f"{sha}.jsonl").exists()
    assert (service.artifact_dir / "files" / "alice" / f"{sha}.jsonl").read_bytes() == data

    alice.post(f"/v1/jobs/{mine}/cancel")
    assert alice.delete(f"/v1/files/{fid}").status_code == 200
    assert alice.get(f"/v1/files/{fid}").status_code == 404
    alice.delete(f"/v1/jobs/{mine}")


def fake_artifacts(folder: Path, size: int) -> None:
    """What a worker would have written for a job: a checkpoint of `size` bytes."""
    (folder / "checkpoints" / "step-000001").mkdir(parents=True)
    (folder / "checkpoints" / "step-000001" / "model.safetensors").write_bytes(b"x" * size)


def test_usage_and_the_storage_quota(make_service: Callable[..., Service]) -> None:
    quota = 3000
    service = make_service(
        PDPPO_MAX_STORAGE_BYTES_PER_TENANT=str(quota), PDPPO_USAGE_CACHE_SECONDS="0"
    )
    service.start_api()  # no worker: jobs stay queued
    with service.client("alice") as alice, service.client("bob") as bob:
        first = records(10, "q")
        assert upload(alice, first).status_code == 201
        job = alice.post("/v1/jobs", json=smoke_spec()).json()["id"]
        fake_artifacts(service.artifact_dir / job, 1000)
        usage = alice.get("/v1/usage")
        assert usage.status_code == 200, usage.text
        body = usage.json()
        assert {k: body[k] for k in ("tenant", "jobs", "files", "bytes", "quota_bytes")} == {
            "tenant": "alice",
            "jobs": {"queued": 1, "running": 0, "paused": 0, "succeeded": 0, "failed": 0,
                     "cancelled": 0},
            "files": 1,
            "bytes": {"files": len(first), "artifacts": 1000, "total": len(first) + 1000},
            "quota_bytes": quota,
        }  # fmt: skip
        assert bob.get("/v1/usage").json()["bytes"] == {"files": 0, "artifacts": 0, "total": 0}

        big = records(60, "big")  # would pass the quota
        assert len(first) + 1000 + len(big) > quota
        refused = upload(alice, big)
        assert refused.status_code == 507
        used = len(first) + 1000
        assert refused.json()["detail"] == (
            f"tenant 'alice' keeps {used} bytes ({len(first)} of uploaded files, 1000 of job "
            f"artifacts); this upload would pass its storage quota of {quota} bytes "
            "(PDPPO_MAX_STORAGE_BYTES_PER_TENANT): delete jobs (pdppo delete ID) or files "
            "(pdppo files delete ID) first"
        )
        assert alice.get("/v1/files").json()["items"][0]["id"] == file_id(first)
        assert len(alice.get("/v1/files").json()["items"]) == 1
        assert upload(bob, big).status_code == 201  # bob's bytes are bob's

        fake_artifacts(service.artifact_dir / ("f" * 24), 5000)  # no job of alice's: not counted
        (service.artifact_dir / job / "final").mkdir()
        (service.artifact_dir / job / "final" / "model.safetensors").write_bytes(b"y" * 2000)
        over = alice.post("/v1/jobs", json=smoke_spec())
        assert over.status_code == 507
        assert over.json()["detail"].startswith(
            f"tenant 'alice' keeps {used + 2000} bytes ({len(first)} of uploaded files, 3000 of "
            f"job artifacts); that is at least its storage quota of {quota} bytes"
        )
        assert alice.get("/v1/usage").json()["jobs"]["queued"] == 1  # nothing was created

        alice.post(f"/v1/jobs/{job}/cancel")
        assert alice.delete(f"/v1/jobs/{job}").status_code == 204
        after = alice.get("/v1/usage").json()
        assert after["bytes"] == {"files": len(first), "artifacts": 0, "total": len(first)}
        assert after["jobs"]["cancelled"] == 0  # deleted jobs are not counted
        assert alice.post("/v1/jobs", json=smoke_spec()).status_code == 201


def test_the_storage_operations_document_their_statuses(service: Service) -> None:
    schema = httpx.get(f"{service.base_url}/openapi.json", timeout=30).json()
    paths = schema["paths"]
    delete_job = paths["/v1/jobs/{job_id}"]["delete"]["responses"]
    assert set(delete_job) == {"204", "401", "404", "409", "422", "500", "503"}
    assert delete_job["409"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorBody"
    }
    usage = paths["/v1/usage"]["get"]["responses"]
    assert usage["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Usage"
    }
    assert {"200", "401", "500", "503"} <= set(usage)
    assert "409" in paths["/v1/files/{file_id}"]["delete"]["responses"]
    error = {"$ref": "#/components/schemas/ErrorBody"}
    both = {"allOf": [error, {"$ref": "#/components/schemas/OpenAIErrorBody"}]}
    for path, body in (("/v1/jobs", error), ("/v1/files", both)):
        assert paths[path]["post"]["responses"]["507"]["content"]["application/json"]["schema"] == (
            body
        )


def test_the_workers_expire_old_artifacts_and_leave_active_jobs_alone(
    make_service: Callable[..., Service],
) -> None:
    service = make_service(
        PDPPO_RETENTION_DAYS=str(3 / 86400),  # three seconds
        PDPPO_RETENTION_INTERVAL_SECONDS="1",
    )
    service.start_api()
    service.start_worker("cpu")
    with service.client("alice") as alice:
        spec = smoke_spec(steps=3, checkpoint_every=1)
        job = alice.post("/v1/jobs", json=spec).json()["id"]
        waiting = alice.post("/v1/jobs", json=parked(smoke_spec())).json()["id"]
        assert wait_status(alice, job, TERMINAL, timeout=180)["status"] == "succeeded"
        folder = service.artifact_dir / job
        assert "checkpoints" in {p.name for p in folder.iterdir()}
        deadline = time.monotonic() + 60
        while {p.name for p in folder.iterdir()} != {"final"}:
            assert time.monotonic() < deadline, sorted(p.name for p in folder.iterdir())
            time.sleep(0.2)
        assert alice.get(f"/v1/jobs/{job}/checkpoints").json()["items"] == []
        model = alice.get(f"/v1/jobs/{job}/model")
        assert model.status_code == 200  # PDPPO_KEEP_FINAL_MODELS: the model stays
        assert alice.get(f"/v1/jobs/{job}").json()["status"] == "succeeded"  # history stays
        assert len(alice.get(f"/v1/jobs/{job}/metrics").json()["items"]) == 3
        assert alice.get(f"/v1/jobs/{waiting}").json()["status"] == "queued"


def test_usage_is_measured_when_asked_and_the_quota_check_reuses_it(
    make_service: Callable[..., Service],
) -> None:
    service = make_service(PDPPO_MAX_STORAGE_BYTES_PER_TENANT="5000")  # cache: 30 s (default)
    service.start_api()
    with service.client("alice") as alice:
        job = alice.post("/v1/jobs", json=smoke_spec()).json()["id"]
        assert alice.get("/v1/usage").json()["bytes"]["artifacts"] == 0
        fake_artifacts(service.artifact_dir / job, 6000)  # a worker wrote a checkpoint since
        # the submit's check reuses the last measurement: not over the quota yet
        assert alice.post("/v1/jobs", json=smoke_spec()).status_code == 201
        assert alice.get("/v1/usage").json()["bytes"]["artifacts"] == 6000  # measured again
        refused = alice.post("/v1/jobs", json=smoke_spec())
        assert refused.status_code == 507, refused.text
