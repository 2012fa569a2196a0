"""A job with `rollout.engine: vllm` through the service: the real API, Redis and a CPU worker,
whose job process runs the vLLM engine (in a process the worker forks per job, under the
worker's memory limit). It trains and streams its metrics; a cancel stops it while the engine
is loaded, and the worker goes on to the next job. The worker declares 2 devices: a job of
`resources.gpus: 2` runs as two processes with an engine each."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from core.models.local_hf import make_chat_hf
from tests.support.stack import (
    REPO,
    TWO_DEVICES,
    RedisServer,
    Service,
    job_pids,
    rank_pids,
    still_running,
)
from tests.support.waits import read_events, wait_for, wait_status
from tests.vllm.specs import chat_spec

TERMINAL = {"succeeded", "failed", "cancelled"}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    redis = RedisServer(tmp_path_factory.mktemp("redis"))
    svc = Service(redis, tmp_path_factory.mktemp("service"), env=TWO_DEVICES)
    try:
        make_chat_hf(svc.data_dir / "chat-llama")
        shutil.copy(REPO / "examples" / "data" / "chat_math.jsonl", svc.data_dir)
        svc.start_api()  # it imports vLLM here, so it offers the engine (PDPPO_ROLLOUT_ENGINES)
        svc.start_worker("cpu")
        yield svc
    finally:
        svc.stop()
        redis.stop()


def spec(svc: Service, steps: int, gpus: int = 1) -> dict[str, Any]:
    body = chat_spec(svc.data_dir / "chat-llama", svc.data_dir, steps)
    body["resources"] = {"device": "cpu", "gpus": gpus}
    body["train"]["checkpoint_every"] = 0
    return body


def test_a_vllm_job_trains_streams_and_cancels_through_the_service(service: Service) -> None:
    with service.client("alice") as alice:
        long = alice.post("/v1/jobs", json=spec(service, 5000))
        assert long.status_code == 201, long.text
        job_id = long.json()["id"]
        wait_for(alice, job_id, lambda j: j["progress"]["step"] >= 2, timeout=180)
        assert alice.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
        cancelled = wait_status(alice, job_id, TERMINAL, timeout=30)
        assert cancelled["status"] == "cancelled", cancelled

        short = alice.post("/v1/jobs", json=spec(service, 3)).json()
        done = wait_status(alice, short["id"], TERMINAL, timeout=180)
        assert done["status"] == "succeeded", (done, service.worker_log()[-4000:])
        metrics = [e["data"] for e in read_events(alice, short["id"]) if e["event"] == "metrics"]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert m["metrics"]["offpolicy_logratio_abs"] < 1e-4, m
        assert m["metrics"]["weight_sync_time"] > 0


def test_a_two_device_vllm_job_samples_on_both_ranks_and_cancels(service: Service) -> None:
    """Each rank's engine is given its rank's weights before every rollout: the global
    off-policy gap stays at precision only if both took every sync. A cancel while both
    engines are loaded leaves neither process running."""
    with service.client("alice") as alice:
        short = alice.post("/v1/jobs", json=spec(service, 3, gpus=2))
        assert short.status_code == 201, short.text
        assert short.json()["queue"] == "cpu.x2"
        done = wait_status(alice, short.json()["id"], TERMINAL, timeout=180)
        assert done["status"] == "succeeded", (done, service.worker_log()[-4000:])
        metrics = [e["data"] for e in read_events(alice, done["id"]) if e["event"] == "metrics"]
        assert [m["step"] for m in metrics] == [1, 2, 3]
        for m in metrics:
            assert m["metrics"]["offpolicy_logratio_abs"] < 1e-4, m
        assert len(rank_pids(service, done["id"])) == 1

        long = alice.post("/v1/jobs", json=spec(service, 5000, gpus=2)).json()
        wait_for(alice, long["id"], lambda j: j["progress"]["step"] >= 1, timeout=180)
        pids = [*job_pids(service, long["id"]), *rank_pids(service, long["id"])]
        assert len(pids) == 2
        assert alice.post(f"/v1/jobs/{long['id']}/cancel").status_code == 202
        cancelled = wait_status(alice, long["id"], TERMINAL, timeout=30)
        assert cancelled["status"] == "cancelled", cancelled
        assert still_running(pids, 10) == []
