"""A job's log says how many torch threads each of its processes got, and why
(`core.process.threads`): the worker's cores (its affinity) over the jobs it runs at once and the
job's ranks, or the operator's setting; `pdppo train --nproc N` splits the cores between its N
processes.

Before, a job ran with torch's default (every core, in every process) and said nothing."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import redis
import yaml

from pdppo.store import events_key, job_key
from tests.support.specs import smoke_spec
from tests.support.stack import Service, pdppo_command
from tests.support.waits import TERMINAL, read_events, wait_status

CORES = len(os.sched_getaffinity(0))  # the workers these tests start inherit it
LONG = {"steps": 5000, "checkpoint_every": 0}  # minutes of work; only a cancel ends it


def job_logs(client: httpx.Client, job_id: str) -> list[str]:
    return [e["data"]["message"] for e in read_events(client, job_id) if e["event"] == "log"]


def test_the_default_is_the_workers_cores_over_its_jobs_at_once(
    make_service: Callable[..., Service],
) -> None:
    svc = make_service(PDPPO_WORKER_JOBS_AT_ONCE="2")
    for name in ("PDPPO_WORKER_TORCH_THREADS", "OMP_NUM_THREADS"):  # the stack's: no setting
        svc.env.pop(name)
    svc.start_api()
    svc.start_worker("cpu")
    with svc.client("alice") as alice:
        job = alice.post("/v1/jobs", json=smoke_spec(steps=1)).json()
        assert wait_status(alice, job["id"], {"succeeded", "failed"})["status"] == "succeeded"
        logs = job_logs(alice, job["id"])
    expected = f"torch threads: {max(1, CORES // 2)} per process ({CORES} cores, 2 jobs at once)"
    assert expected in logs, logs


def threads_said(client: redis.Redis, job_id: str) -> list[str]:
    """The job's `torch threads` log lines so far, read from its event stream in Redis."""
    said = []
    for _, fields in client.xrange(events_key(job_id)):
        message = json.loads(fields["data"]).get("message", "") if fields["type"] == "log" else ""
        if message.startswith("torch threads: "):
            said.append(message)
    return said


def wait_said(client: redis.Redis, job_id: str, line: str, after: int = 0) -> list[str]:
    """The job's thread lines once `line` is among them past the first `after`."""
    deadline = time.monotonic() + 90
    while line not in (said := threads_said(client, job_id))[after:]:
        assert time.monotonic() < deadline, (line, said)
        time.sleep(0.2)
    return said


def test_two_workers_on_one_host_split_its_cores_between_their_jobs(
    make_service: Callable[..., Service],
) -> None:
    """No setting: each job counts the jobs running on its host (`workers.job.cores`). Alone, a
    job takes every core; with a second worker's job beside it, each takes half (at least one),
    the first at its next step; when the second ends, the first takes them back. Each took every
    core before, whatever ran beside it."""
    svc = make_service()
    for name in ("PDPPO_WORKER_TORCH_THREADS", "OMP_NUM_THREADS"):  # the stack's: no setting
        svc.env.pop(name)
    svc.start_api()
    svc.start_worker("cpu")
    svc.start_worker("cpu")
    alone = f"torch threads: {CORES} per process ({CORES} cores, 1 job running on this host)"
    halves = (
        f"torch threads: {max(1, CORES // 2)} per process ({CORES} cores, 2 jobs running on "
        "this host)"
    )
    store = redis.Redis.from_url(svc.redis_url, decode_responses=True)
    with svc.client("alice") as alice:
        first = alice.post("/v1/jobs", json=smoke_spec(**LONG)).json()["id"]
        assert wait_said(store, first, alone)[0] == alone
        second = alice.post("/v1/jobs", json=smoke_spec(**LONG)).json()["id"]
        try:
            assert wait_said(store, second, halves)[0] == halves
            workers = {store.hget(job_key(j), "worker") for j in (first, second)}
            assert len(workers) == 2, workers  # one job on each worker
            split = wait_said(store, first, halves)
            assert split[:2] == [alone, halves], split
            alice.post(f"/v1/jobs/{second}/cancel")
            assert wait_status(alice, second, TERMINAL, timeout=30)["status"] == "cancelled"
            back = wait_said(store, first, alone, after=2)
            assert back[:3] == [alone, halves, alone], back
        finally:
            for job in (first, second):
                alice.post(f"/v1/jobs/{job}/cancel")
            for job in (first, second):
                wait_status(alice, job, TERMINAL, timeout=30)
    store.close()


def test_the_operators_setting_is_said_by_its_name(alice: httpx.Client) -> None:
    """The shared stack sets PDPPO_WORKER_TORCH_THREADS=1, the setting's former name."""
    job = alice.post("/v1/jobs", json=smoke_spec(steps=1)).json()
    assert wait_status(alice, job["id"], {"succeeded", "failed"})["status"] == "succeeded"
    logs = job_logs(alice, job["id"])
    assert "torch threads: 1 per process (PDPPO_WORKER_TORCH_THREADS)" in logs, logs


def test_pdppo_train_splits_the_cores_between_its_processes(tmp_path: Path) -> None:
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(smoke_spec(steps=1)))
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PDPPO_JOB_THREADS")}
    args = ["train", str(spec_file), "--nproc", "2", "--out", str(tmp_path / "o"), "--quiet"]
    out = subprocess.run(
        [*pdppo_command(), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    expected = f"torch threads: {max(1, CORES // 2)} per process ({CORES} cores, 2 processes)"
    assert out.stdout.splitlines()[:2] == [expected, "training on 2 processes"], out.stdout
