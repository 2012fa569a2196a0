"""Service jobs (the real API, worker and Redis: tests/integration's fixtures) reported to the
trackers the operator configured, and a tracker killed in the middle of a job."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.mlflow import MlflowServer, start_mlflow
from tests.support.specs import smoke_spec
from tests.support.stack import Service
from tests.support.waits import read_events, wait_for, wait_status
from tests.tracking.readers import tensorboard_scalars, wandb_history

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")
pytest.importorskip("wandb")
pytestmark = pytest.mark.integration


def test_service_job_reported_to_all_three(
    make_service: Callable[..., Service],
    mlflow_server: MlflowServer,
) -> None:
    svc = make_service(
        PDPPO_MLFLOW_TRACKING_URI=mlflow_server.url,
        PDPPO_MLFLOW_EXPERIMENT="service",
        WANDB_MODE="offline",
        WANDB_SILENT="true",
    )
    svc.start_api()
    svc.start_worker("cpu")
    with svc.client("alice") as alice:
        spec = smoke_spec(steps=4, report_to=["tensorboard", "mlflow", "wandb"])
        # a correction that bites: bf16 rollouts put mu off pi by ~3e-4 in log (measured), and
        # IcePop's band of 5e-4 drops 20-45% of the tokens of each step
        spec["train"]["rollout"]["dtype"] = "bfloat16"
        spec["train"]["algorithm"]["correction"] = {
            "type": "icepop",
            "low": 0.9995,
            "high": 1.0005,
        }
        job_id = alice.post("/v1/jobs", json=spec).json()["id"]
        job = wait_status(alice, job_id, {"succeeded", "failed"}, timeout=120)
        assert job["status"] == "succeeded", job
        history = alice.get(f"/v1/jobs/{job_id}/metrics").json()["items"]
        events = read_events(alice, job_id)
    steps = {row["step"]: row["metrics"] for row in history}
    assert sorted(steps) == [1, 2, 3, 4]
    # the corrections' fractions are step metrics like masked_fraction: history, SSE, trackers
    streamed = {e["data"]["step"]: e["data"]["metrics"] for e in events if e["event"] == "metrics"}
    for key in ("masked_fraction", *CORRECTION_STATS):
        assert [streamed[step][key] for step in sorted(steps)] == [
            steps[step][key] for step in sorted(steps)
        ], key
    assert all(0 < m["correction_masked_fraction"] < 1 for m in steps.values())
    trackers = job["trackers"]
    assert sorted(trackers) == ["mlflow", "tensorboard", "wandb"]
    job_dir = svc.artifact_dir / job_id
    assert trackers["tensorboard"] == {"run_id": str(job_dir / "tensorboard"), "url": None}
    run_id = trackers["mlflow"]["run_id"]
    assert trackers["mlflow"]["url"].startswith(f"{mlflow_server.url}/#/experiments/")

    from mlflow import MlflowClient

    client = MlflowClient(mlflow_server.url)
    run = client.get_run(run_id)
    assert run.info.run_name == job_id and run.info.status == "FINISHED"
    assert run.data.tags["pdppo.job"] == job_id and run.data.tags["pdppo.tenant"] == "alice"
    for key in steps[1]:
        got = sorted((m.step, m.value) for m in client.get_metric_history(run_id, f"train/{key}"))
        assert got == [(step, steps[step][key]) for step in sorted(steps)]
    scalars = tensorboard_scalars(job_dir / "tensorboard")
    wandb_rows = wandb_history(job_dir / "wandb")
    for key in ("entropy", *CORRECTION_STATS):
        assert [step for step, _ in scalars[f"train/{key}"]] == [1, 2, 3, 4]
        rows = [row for row in wandb_rows if f"train/{key}" in row]
        assert [(row["_step"], row[f"train/{key}"]) for row in rows] == [
            (step, steps[step][key]) for step in sorted(steps)
        ]


CORRECTION_STATS = ("correction_masked_fraction", "correction_clipped_fraction")


def wait_for_run(server: MlflowServer, job_id: str, timeout: float = 120) -> None:
    """Until the job's MLflow run exists (its reporter opened it)."""
    import time

    from mlflow import MlflowClient

    client = MlflowClient(server.url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = client.get_experiment_by_name("pdppo")
        if found is not None and client.search_runs(
            [found.experiment_id], f"attributes.run_name = '{job_id}'"
        ):
            return
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} opened no MLflow run in {timeout} s")


@pytest.mark.mlflow_server  # starts its own, to kill it
def test_tracker_killed_mid_job(
    make_service: Callable[..., Service],
    tmp_path: Path,
) -> None:
    """The MLflow server dies after the job's run is open: the job trains on and succeeds, and
    its log says how many reports were dropped."""
    server = start_mlflow(tmp_path / "mlflow")
    try:
        svc = make_service(
            PDPPO_MLFLOW_TRACKING_URI=server.url,
            PDPPO_TRACKING_QUEUE_SIZE="2",
            PDPPO_TRACKING_CLOSE_SECONDS="1",
        )
        svc.start_api()
        svc.start_worker("cpu")
        with svc.client("alice") as alice:
            spec = smoke_spec(steps=300, checkpoint_every=100, report_to=["mlflow"])
            job_id = alice.post("/v1/jobs", json=spec).json()["id"]
            wait_for_run(server, job_id)
            server.stop()
            job = alice.get(f"/v1/jobs/{job_id}").json()
            assert job["status"] == "running" and job["progress"]["step"] < 250, job
            job = wait_status(alice, job_id, {"succeeded", "failed"}, timeout=300)
            assert job["status"] == "succeeded", job
            assert job["progress"]["step"] == 300
            logs = [e["data"]["message"] for e in read_events(alice, job_id) if e["event"] == "log"]
    finally:
        server.stop()
    dropped = [line for line in logs if line.startswith("reports to mlflow:")]
    assert dropped, logs
    assert "dropped so far" in dropped[0] and "training goes on" in dropped[0]
    assert "gave up after 1 s at the end of the run" in dropped[-1], dropped


def test_job_resumed_after_kill_9_continues_its_tracker_runs(
    make_service: Callable[..., Service],
    mlflow_server: MlflowServer,
) -> None:
    """A worker killed with -9 mid-job: the next worker resumes from the last checkpoint,
    trains the steps after it again, and reports into the same MLflow run and TensorBoard
    folder, each step once."""
    steps = 600
    svc = make_service(PDPPO_MLFLOW_TRACKING_URI=mlflow_server.url)
    svc.start_api()
    first = svc.start_worker()
    with svc.client("alice") as alice:
        spec = smoke_spec(
            steps=steps,
            checkpoint_every=50,
            keep_checkpoints=20,
            report_to=["mlflow", "tensorboard"],
        )
        job_id = alice.post("/v1/jobs", json=spec).json()["id"]
        told = wait_for(alice, job_id, lambda j: len(j["trackers"]) == 2)  # both runs open
        at = told["progress"]["step"] + 60
        before = wait_for(alice, job_id, lambda j: j["progress"]["step"] >= at)
        svc.kill_worker(first)
        killed_at = alice.get(f"/v1/jobs/{job_id}").json()["progress"]["step"]
        assert killed_at < steps, "the job finished before the kill; make it longer"
        svc.start_worker()
        done = wait_status(alice, job_id, {"succeeded", "failed"}, timeout=180)
        assert done["status"] == "succeeded" and done["attempts"] == 2, done
        history = alice.get(f"/v1/jobs/{job_id}/metrics").json()["items"]
        logs = [e["data"]["message"] for e in read_events(alice, job_id) if e["event"] == "log"]
    resumed = [m for m in logs if m.startswith("resumed from")]
    assert len(resumed) == 1 and int(resumed[0].rsplit(" ", 1)[1]) < killed_at, (resumed, killed_at)
    assert done["trackers"] == before["trackers"]  # the same runs, continued
    from mlflow import MlflowClient

    run_id = done["trackers"]["mlflow"]["run_id"]
    entropy = MlflowClient(mlflow_server.url).get_metric_history(run_id, "train/entropy")
    assert sorted(m.step for m in entropy) == list(range(1, steps + 1))
    expected = {row["step"]: row["metrics"]["entropy"] for row in history}
    assert {m.step: m.value for m in entropy} == expected
    scalars = tensorboard_scalars(svc.artifact_dir / job_id / "tensorboard")
    assert [step for step, _ in scalars["train/entropy"]] == list(range(1, steps + 1))
