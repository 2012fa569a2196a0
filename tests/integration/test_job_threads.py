"""A job's log says how many torch threads each of its processes got, and why
(`core.process.threads`): the worker's cores (its affinity) over the jobs it runs at once and the
job's ranks, or the operator's setting; `pdppo train --nproc N` splits the cores between its N
processes.

Before, a job ran with torch's default (every core, in every process) and said nothing."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import yaml

from tests.integration.conftest import read_events, wait_status
from tests.integration.stack import Service, pdppo_command, smoke_spec

CORES = len(os.sched_getaffinity(0))  # the workers these tests start inherit it


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
