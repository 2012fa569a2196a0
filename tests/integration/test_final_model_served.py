"""The final model is advertised (`final_model_url`) and served (`/model`) for succeeded jobs
only, whatever the artifact store holds.

Before, both only checked that `<job>/final` existed, and the issue found a cancelled job's model
served (3 of 3), a half model (model.safetensors, no config.json) served for a job whose process
and worker were killed during the final save and which was then cancelled, and crashed jobs
advertising `final_model_url` while still running (4 of 4). The folders below are what those
runs left on disk; the trainer no longer leaves a half one (`tests/core/test_atomic_dir.py`),
but a whole one of a job that did not succeed is no more its model."""

from __future__ import annotations

import io
import os
import signal
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.support.specs import smoke_spec
from tests.support.stack import Service, job_pids
from tests.support.waits import wait_for, wait_status

LONG = {"steps": 5000, "checkpoint_every": 0}


def leave_final(service: Service, job_id: str, files: dict[str, bytes]) -> Path:
    folder = service.artifact_dir / job_id / "final"
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def assert_no_final_model(alice: httpx.Client, job_id: str, status: str) -> None:
    listing = alice.get(f"/v1/jobs/{job_id}/checkpoints")
    assert listing.status_code == 200, listing.text
    assert listing.json()["final_model_url"] is None
    model = alice.get(f"/v1/jobs/{job_id}/model")
    assert model.status_code == 404, model.text[:200]
    assert f"it is {status}" in model.json()["detail"]


def test_a_cancelled_jobs_final_folder_is_not_served(alice: httpx.Client, service: Service) -> None:
    job = alice.post("/v1/jobs", json=smoke_spec(**LONG)).json()
    wait_for(alice, job["id"], lambda j: j["status"] == "running" and j["progress"]["step"] >= 1)
    assert alice.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202
    wait_status(alice, job["id"], "cancelled", timeout=30)
    # killed during the final save, then cancelled: half a model
    leave_final(service, job["id"], {"model.safetensors": b"half"})
    assert_no_final_model(alice, job["id"], "cancelled")
    # cancelled as the save completed: a whole one
    leave_final(service, job["id"], {"config.json": b"{}"})
    assert_no_final_model(alice, job["id"], "cancelled")


def test_a_running_jobs_final_folder_is_not_advertised(
    alice: httpx.Client, service: Service
) -> None:
    """A job that saved its model and died before its end was recorded runs again: its record
    says running, and so does the API."""
    job = alice.post("/v1/jobs", json=smoke_spec(**LONG)).json()
    wait_status(alice, job["id"], "running")
    try:
        leave_final(service, job["id"], {"model.safetensors": b"w", "config.json": b"{}"})
        assert_no_final_model(alice, job["id"], "running")
    finally:
        alice.post(f"/v1/jobs/{job['id']}/cancel")
        wait_status(alice, job["id"], "cancelled", timeout=30)


def test_a_succeeded_jobs_model_is_served_whole(alice: httpx.Client) -> None:
    job = alice.post("/v1/jobs", json=smoke_spec(steps=2)).json()
    wait_status(alice, job["id"], "succeeded")
    listing = alice.get(f"/v1/jobs/{job['id']}/checkpoints").json()
    assert listing["final_model_url"] == f"/v1/jobs/{job['id']}/model"
    model = alice.get(listing["final_model_url"])
    assert model.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(model.content)) as tar:
        names = sorted(m.name for m in tar.getmembers() if m.isfile())
    assert names == ["final/README.md", "final/config.json", "final/model.safetensors"]


def test_a_job_killed_during_its_final_save_serves_nothing_until_it_succeeds(
    make_service: Callable[..., Service],
) -> None:
    """The issue's run: the job process and its worker killed (-9) during the final save. The
    job is still running (its lease has not run out): nothing is advertised. The next worker
    resumes it from its last checkpoint, saves the final model again, and that one is served,
    whole. The kill lands as soon as the save's folder appears (`final.tmp`, before: `final`),
    the job process stopped first so that it cannot finish meanwhile."""
    svc = make_service()
    svc.start_api()
    first = svc.start_worker()
    spec = smoke_spec(steps=2, checkpoint_every=1)
    # a model of 12 MB: a save long enough to land in
    spec["train"]["model"]["tiny"] = {
        "d_model": 256,
        "n_layers": 4,
        "n_heads": 4,
        "max_seq_len": 32,
    }
    with svc.client("alice") as alice:
        job_id = alice.post("/v1/jobs", json=spec).json()["id"]
        wait_status(alice, job_id, "running")
        deadline = time.monotonic() + 60
        while not (pids := job_pids(svc, job_id)):
            assert time.monotonic() < deadline, svc.worker_log()[-2000:]
            time.sleep(0.05)
        folder = svc.artifact_dir / job_id
        while not ((folder / "final.tmp").exists() or (folder / "final").exists()):
            assert time.monotonic() < deadline, "no final save seen"
        os.kill(pids[0], signal.SIGSTOP)
        svc.kill_worker(first)
        os.kill(pids[0], signal.SIGKILL)
        killed = alice.get(f"/v1/jobs/{job_id}").json()
        assert killed["status"] == "running", f"the job ended before the kill: {killed}"
        assert_no_final_model(alice, job_id, "running")
        if (folder / "final").exists():  # killed after the rename: whole
            assert sorted(p.name for p in (folder / "final").iterdir()) == [
                "README.md",
                "config.json",
                "model.safetensors",
            ]

        svc.start_worker()
        done = wait_status(alice, job_id, {"succeeded", "failed", "cancelled"}, timeout=120)
        assert done["status"] == "succeeded", done
        listing = alice.get(f"/v1/jobs/{job_id}/checkpoints").json()
        model = alice.get(listing["final_model_url"])
        assert model.status_code == 200
        with tarfile.open(fileobj=io.BytesIO(model.content)) as tar:
            names = sorted(m.name for m in tar.getmembers() if m.isfile())
        assert names == ["final/README.md", "final/config.json", "final/model.safetensors"]
        assert not (folder / "final.tmp").exists()
