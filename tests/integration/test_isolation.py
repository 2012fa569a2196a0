"""A job cannot take its worker down or ignore a stop: it trains in a process of its own, which
the worker asks to stop (cancel, timeout), kills when it does not, and outlives when it dies."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.specs import smoke_spec
from tests.support.stack import Service, running, still_running
from tests.support.waits import read_events, wait_for, wait_status

TERMINAL = {"succeeded", "failed", "cancelled"}
LONG = {"steps": 5000, "checkpoint_every": 0}


def job_pid(service: Service, job_id: str, worker: int = 0, timeout: float = 30) -> int:
    """The job process's pid, as the worker logs it when it starts the job."""
    pattern = re.compile(rf"job {job_id}: training in process (\d+)")
    deadline = time.monotonic() + timeout
    while not (found := pattern.findall(service.worker_log(worker))):
        assert time.monotonic() < deadline, service.worker_log(worker)[-3000:]
        time.sleep(0.1)
    return int(found[-1])


def logs(client: httpx.Client, job_id: str) -> list[str]:
    return [e["data"]["message"] for e in read_events(client, job_id) if e["event"] == "log"]


def smoke_succeeds(client: httpx.Client) -> None:
    """The worker that just lost a job takes the next one and finishes it."""
    job = client.post("/v1/jobs", json=smoke_spec()).json()
    done = wait_status(client, job["id"], TERMINAL, timeout=90)
    assert done["status"] == "succeeded", done


def big_rollout() -> dict[str, Any]:
    """A step whose token loop runs for tens of seconds of CPU: 512 rows of a wider model, 300
    tokens each (some row is still alive at the last token, so no early end)."""
    spec = smoke_spec(**LONG)
    spec["train"]["model"]["tiny"] = {
        "d_model": 256,
        "n_layers": 4,
        "n_heads": 4,
        "max_seq_len": 340,
    }
    spec["train"]["rollout"].update(prompts_per_step=16, group_size=32, max_new_tokens=300)
    spec["train"].setdefault("algorithm", {})["minibatches"] = 8  # the update's peak fits a worker
    return spec


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_cancel_lands_inside_a_long_rollout(alice: httpx.Client, service: Service) -> None:
    """Imports, model set-up and the prompts' prefill take 2 to 5 s of CPU here, sampling step
    1 about 35 s more (measured in one process, two threads), so at 8 s of CPU the job is well
    inside it, on a machine three times as fast too. (With 120 tokens sampling ended near 12 s,
    and a cancel at 10 s could land in the step's update, which checks for a stop only between
    minibatches: that cancel waits for the grace period.)"""
    job = alice.post("/v1/jobs", json=big_rollout()).json()
    pid = job_pid(service, job["id"], timeout=60)
    deadline = time.monotonic() + 60
    while cpu_seconds(pid) < 8:
        assert time.monotonic() < deadline
        time.sleep(0.05)

    asked = time.monotonic()
    assert alice.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202
    done = wait_status(alice, job["id"], TERMINAL, timeout=30)
    took = time.monotonic() - asked

    assert done["status"] == "cancelled", done
    assert took < 15, f"cancel took {took:.1f}s"  # not the rollout's 35 s; the logs say how
    assert done["progress"]["step"] == 0
    messages = logs(alice, job["id"])
    assert "stopped during generation of step 1; stopped at step 0" in messages
    assert "cancelled (at step 0)" in messages


def test_a_job_that_ignores_the_stop_is_killed_and_the_worker_goes_on(
    alice: httpx.Client, service: Service
) -> None:
    """SIGSTOP freezes the job process mid-step, as a hung kernel call or a FIFO read would:
    it can no longer stop by itself, so the worker kills it after the grace period (5 s)."""
    job = alice.post("/v1/jobs", json=smoke_spec(**LONG)).json()
    wait_for(alice, job["id"], lambda j: j["progress"]["step"] >= 2)
    pid = job_pid(service, job["id"])
    os.kill(pid, signal.SIGSTOP)
    worker = service.workers[0].pid

    asked = time.monotonic()
    assert alice.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202
    done = wait_status(alice, job["id"], TERMINAL, timeout=30)
    took = time.monotonic() - asked

    assert done["status"] == "cancelled", done
    assert 4.5 < took < 10, f"cancel took {took:.1f}s"
    assert "cancelled (killed after the grace period)" in logs(alice, job["id"])
    assert still_running([pid], 5) == [], f"process {pid} is still alive"
    assert running(worker)
    smoke_succeeds(alice)


def test_a_job_killed_by_a_signal_fails_as_killed_and_the_worker_survives(
    alice: httpx.Client, service: Service
) -> None:
    job = alice.post("/v1/jobs", json=smoke_spec(**LONG)).json()
    wait_for(alice, job["id"], lambda j: j["progress"]["step"] >= 2)
    os.kill(job_pid(service, job["id"]), signal.SIGKILL)  # what the kernel's OOM killer does

    done = wait_status(alice, job["id"], TERMINAL, timeout=30)
    assert done["status"] == "failed", done
    assert done["error"]["code"] == "killed"
    assert done["error"]["message"].startswith("the job's process was killed by SIGKILL")
    events = read_events(alice, job["id"])
    assert events[-1]["data"] == {"status": "failed"}
    assert any(
        e["event"] == "log" and e["data"]["message"].startswith("failed (killed): ") for e in events
    )
    assert service.workers[0].poll() is None
    smoke_succeeds(alice)


def test_timeout_fails_the_job_and_keeps_its_checkpoint(alice: httpx.Client) -> None:
    spec = smoke_spec(steps=100_000, checkpoint_every=5, keep_checkpoints=2)
    spec["resources"]["timeout_minutes"] = 0.1  # 6 s
    job = alice.post("/v1/jobs", json=spec).json()
    started = wait_status(alice, job["id"], "running")
    assert started["spec"]["resources"]["timeout_minutes"] == 0.1

    done = wait_status(alice, job["id"], TERMINAL, timeout=60)
    assert done["status"] == "failed", done
    assert done["error"]["code"] == "timeout"
    step = done["progress"]["step"]
    assert 5 <= step < 100_000
    assert done["error"]["message"] == (
        f"the job ran past its timeout of 0.1 minutes and was stopped at step {step}; "
        "its checkpoints are kept"
    )
    points = alice.get(f"/v1/jobs/{job['id']}/checkpoints").json()["items"]
    assert points and points[-1]["step"] == step  # the stop itself saved the last step


def test_a_killed_worker_takes_its_job_process_with_it(
    make_service: Callable[..., Service],
) -> None:
    """kill -9 of the worker: its job process exits at once instead of writing on behind the
    job's next holder."""
    svc = make_service()
    svc.start_api()
    worker = svc.start_worker()
    with svc.client("alice") as alice:
        job = alice.post("/v1/jobs", json=smoke_spec(**LONG)).json()
        wait_for(alice, job["id"], lambda j: j["progress"]["step"] >= 2)
        pid = job_pid(svc, job["id"])
        svc.kill_worker(worker)
        assert still_running([pid], 3) == [], f"process {pid} is still alive"
        alice.post(f"/v1/jobs/{job['id']}/cancel")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_to_the_workers_group_do_not_reach_the_job(
    make_service: Callable[..., Service], sig: signal.Signals
) -> None:
    """`pdppo dev` stops a worker by signalling its process group: the job still checkpoints
    and is handed back, because only its worker decides when it stops."""
    svc = make_service()
    svc.start_api()
    worker = svc.start_worker()
    with svc.client("alice") as alice:
        job = alice.post("/v1/jobs", json=smoke_spec(**LONG)).json()
        wait_for(alice, job["id"], lambda j: j["progress"]["step"] >= 2)
        os.killpg(worker.pid, sig)
        assert worker.wait(30) == 0, svc.worker_log()[-3000:]
        handed = alice.get(f"/v1/jobs/{job['id']}").json()
        assert handed["status"] == "queued", handed
        points = alice.get(f"/v1/jobs/{job['id']}/checkpoints").json()["items"]
        assert [c["step"] for c in points] == [handed["progress"]["step"]]
        alice.post(f"/v1/jobs/{job['id']}/cancel")


def test_a_job_that_takes_down_workers_is_failed_not_retried_forever(
    make_service: Callable[..., Service],
) -> None:
    """Past PDPPO_MAX_WORKER_LOSSES dead workers the reaper fails the job: a poison job must not
    take down every worker in turn, forever."""
    svc = make_service(PDPPO_MAX_WORKER_LOSSES="1")
    svc.start_api()
    with svc.client("alice") as alice:
        job = alice.post("/v1/jobs", json=smoke_spec(**LONG)).json()
        for attempt in (1, 2):
            worker = svc.start_worker()
            wait_for(
                alice,
                job["id"],
                lambda j, n=attempt: j["status"] == "running" and j["attempts"] == n,  # type: ignore[misc]
            )
            time.sleep(1)
            svc.kill_worker(worker)
        svc.start_worker()  # its reaper finds the job's lease expired for the second time
        done = wait_status(alice, job["id"], TERMINAL, timeout=60)
        assert done["status"] == "failed", done
        assert done["error"]["code"] == "worker_lost"
        assert done["error"]["message"].startswith("the job's worker died 2 times")
        assert done["attempts"] == 2


def test_timeout_above_the_server_maximum_is_refused(alice: httpx.Client) -> None:
    spec = smoke_spec()
    spec["resources"]["timeout_minutes"] = 8 * 24 * 60  # the default maximum is 7 days
    response = alice.post("/v1/jobs", json=spec)
    assert response.status_code == 422, response.text
    assert "resources.timeout_minutes" in response.text and "10080" in response.text


def test_out_of_memory_in_the_job_fails_it_and_the_worker_survives(
    make_service: Callable[..., Service],
) -> None:
    """Under the job's address-space limit a step too large for it fails to allocate inside the
    job process, which reports it; the budget check that would refuse it at submit is lifted.
    The weights are small (a 64-wide model with a 262,144-token head: 34 M parameters, a 0.4 GB
    first checkpoint, so the disk check at start passes on any test machine), while the unfused
    loss's logits for its 256 sequences (256 x ~26 tokens x 1 MiB each) are far over the 3000 MB
    limit."""
    svc = make_service(
        PDPPO_JOB_MEMORY_LIMIT_MB="3000",
        PDPPO_MAX_JOB_MEMORY_GB_CPU="100000",
        PDPPO_MAX_PARAMS_CPU="100000000000",
    )
    svc.start_api()
    svc.start_worker()
    with svc.client("alice") as alice:
        spec = smoke_spec()
        spec["train"]["model"]["tiny"] = {
            "d_model": 64,
            "n_layers": 1,
            "n_heads": 4,
            "max_seq_len": 32,
            "vocab_size": 262144,
        }
        spec["train"]["rollout"].update(prompts_per_step=16, group_size=16)
        spec["train"]["algorithm"]["fused_loss"] = False
        created = alice.post("/v1/jobs", json=spec)
        assert created.status_code == 201, created.text
        done = wait_status(alice, created.json()["id"], TERMINAL, timeout=60)
        assert done["status"] == "failed", done
        assert done["error"]["code"] == "out_of_memory", done["error"]
        assert "can't allocate memory" in done["error"]["message"]
        assert svc.workers[0].poll() is None
        smoke_succeeds(alice)


def test_a_pausing_job_that_ignores_the_stop_is_killed_and_said_to_be_paused(
    alice: httpx.Client, service: Service
) -> None:
    """The grace kill of a pause parks the job as paused, and the worker's log says that: it
    said "the pause was withdrawn while the job stopped; queued again to run on" instead."""
    job = alice.post("/v1/jobs", json=smoke_spec(**LONG)).json()
    wait_for(alice, job["id"], lambda j: j["progress"]["step"] >= 2)
    pid = job_pid(service, job["id"])
    os.kill(pid, signal.SIGSTOP)
    try:
        assert alice.post(f"/v1/jobs/{job['id']}/pause").status_code == 202
        paused = wait_status(alice, job["id"], {"paused", *TERMINAL}, timeout=30)
        assert paused["status"] == "paused", paused
        ended = f"job {job['id']}: stopped for a pause (killed after the grace period); handed "
        deadline = time.monotonic() + 10
        while ended not in (said := service.worker_log()):
            assert time.monotonic() < deadline, said[-3000:]
            time.sleep(0.1)
        mine = [line for line in said.splitlines() if f"job {job['id']}: " in line]
        assert any(line.endswith(f"{ended}back: paused") for line in mine), mine
        handed = [line for line in mine if "handed back (" in line]
        assert len(handed) == 1 and handed[0].endswith("(paused): it waits for a resume"), mine
        assert still_running([pid], 5) == [], f"process {pid} is still alive"
    finally:
        alice.post(f"/v1/jobs/{job['id']}/cancel")
