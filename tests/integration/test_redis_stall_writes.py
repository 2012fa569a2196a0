"""A 5xx never hides a write: under a Redis stall longer than the API's store timeout, a write
answers 201/202 with its result, or an error after which nothing happened, or a 503 naming the
job or file it may still create or change (issue 37, point 3).

Redis runs a command that reached it during a `DEBUG SLEEP` when it wakes, even after the API
gave up on the answer: a job answered 503 then exists and runs. The lookups before a cancel,
pause, resume or PATCH would meet the sleep first (and write nothing), so those are stalled with
`CLIENT PAUSE ... WRITE` instead, which serves the reads and holds the write itself.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from pdppo.client import Client
from pdppo.store.keys import events_key
from tests.integration.redis_hold import HoldingProxy
from tests.support.specs import records, smoke_spec
from tests.support.stack import KEYS, REPO, RedisServer, Service, pdppo_command, stall
from tests.support.waits import wait_status

STORE_TIMEOUT = "1"  # the API's wait for one Redis reply (PDPPO_REDIS_SOCKET_TIMEOUT_SECONDS)
STALL_SECONDS = 4
TERMINAL = {"succeeded", "failed", "cancelled"}


@pytest.fixture
def svc(own_redis: RedisServer, tmp_path: Path) -> Iterator[Service]:
    service = Service(
        own_redis, tmp_path / "service", env={"PDPPO_REDIS_SOCKET_TIMEOUT_SECONDS": STORE_TIMEOUT}
    )
    service.start_api()
    yield service
    service.stop()


def pause_writes(server: RedisServer, seconds: float) -> threading.Thread:
    """Writes wait `seconds` (reads are served), as `stall` but past the route's lookups."""
    client = redis.Redis(port=server.port, socket_timeout=10)
    client.execute_command("CLIENT", "PAUSE", int(seconds * 1000), "WRITE")
    client.close()
    timer = threading.Thread(target=time.sleep, args=(seconds,), daemon=True)
    timer.start()
    return timer


def warm_up(svc: Service) -> None:
    """A job of another tenant, created and cancelled: the API has loaded its scripts, as one
    that has served a while has (a script sent before it is loaded fails when Redis wakes, so
    the first create of a fresh API would not show the stall's effect)."""
    with svc.client("bob") as bob:
        job_id = bob.post("/v1/jobs", json=smoke_spec()).json()["id"]
        assert bob.post(f"/v1/jobs/{job_id}/cancel").status_code == 202


def tenant_job_ids(svc: Service) -> list[str]:
    with svc.client("alice") as alice:
        return [j["id"] for j in alice.get("/v1/jobs", params={"limit": 100}).json()["items"]]


def test_a_submit_answered_503_names_the_job_it_created(
    own_redis: RedisServer, svc: Service
) -> None:
    """The reproduction: during the stall the submit answers 503, and once Redis is back the job
    exists and runs. The 503 names it, so the client need not guess."""
    warm_up(svc)
    with svc.client("alice") as alice:
        sleeper = stall(own_redis, STALL_SECONDS)
        started = time.monotonic()
        answer = alice.post("/v1/jobs", json=smoke_spec())
        took = time.monotonic() - started
        sleeper.join(STALL_SECONDS + 30)

        assert answer.status_code == 503, answer.text
        assert took < STALL_SECONDS, took  # answered at the store timeout, not after the stall
        body = answer.json()
        job_id = body["job_id"]
        assert answer.headers["Pdppo-Job-Id"] == job_id
        assert answer.headers["Retry-After"] == "5"
        assert body["detail"] == (
            f"the job store did not answer in time; the creation of job {job_id} may still take "
            f"effect when it does (GET /v1/jobs/{job_id} tells, once it answers), and a retry "
            "with the same Idempotency-Key returns that job, never a second"
        )
        # Redis ran the create when it woke: the job the 503 named, and no other, runs.
        assert tenant_job_ids(svc) == [job_id]
        svc.start_worker()
        done = wait_status(alice, job_id, TERMINAL, timeout=180)
        assert done["status"] == "succeeded", done


def test_the_client_retries_a_submit_through_the_stall_without_a_duplicate(
    own_redis: RedisServer, svc: Service
) -> None:
    with Client(svc.base_url, KEYS["alice"], retry_seconds=30, max_retry_delay=0.5) as client:
        sleeper = stall(own_redis, STALL_SECONDS)
        job = client.submit(smoke_spec())
        sleeper.join(STALL_SECONDS + 30)
    assert job.status == "queued"
    assert tenant_job_ids(svc) == [job.id]


def test_a_client_that_gives_up_says_which_job_may_exist(
    own_redis: RedisServer, svc: Service
) -> None:
    from pdppo.client import ApiError

    warm_up(svc)
    with Client(svc.base_url, KEYS["alice"], retry_seconds=0.5, max_retry_delay=0.2) as client:
        sleeper = stall(own_redis, STALL_SECONDS)
        with pytest.raises(ApiError) as info:
            client.submit(smoke_spec(), idempotency_key="stalled-1")
        sleeper.join(STALL_SECONDS + 30)
        assert info.value.status_code == 503
        assert info.value.may_exist, info.value
        assert "Idempotency-Key stalled-1" in str(info.value)
        # Submitting again with that key returns the job the stall created, not a second one.
        again = client.submit(smoke_spec(), idempotency_key="stalled-1")
    assert again.id in info.value.may_exist
    assert tenant_job_ids(svc) == [again.id]


def _upload(http: httpx.Client) -> httpx.Response:
    return http.post(
        "/v1/files",
        files={"file": ("data.jsonl", records(8), "application/x-ndjson")},
    )


WRITES: dict[str, Callable[[httpx.Client, str], httpx.Response]] = {
    "cancel": lambda h, j: h.post(f"/v1/jobs/{j}/cancel"),
    "pause": lambda h, j: h.post(f"/v1/jobs/{j}/pause"),
    "patch": lambda h, j: h.patch(
        f"/v1/jobs/{j}",
        content=b'{"train": {"optim": {"lr": 0.0003}}}',
        headers={"Content-Type": "application/merge-patch+json"},
    ),
}


@pytest.mark.parametrize("write", sorted(WRITES))
def test_a_job_write_answered_503_names_the_job(
    own_redis: RedisServer, svc: Service, write: str
) -> None:
    with svc.client("alice") as alice:
        job_id = alice.post("/v1/jobs", json=smoke_spec()).json()["id"]
        timer = pause_writes(own_redis, STALL_SECONDS)
        answer = WRITES[write](alice, job_id)
        timer.join()
        assert answer.status_code == 503, answer.text
        assert answer.json()["job_id"] == job_id
        assert answer.headers["Pdppo-Job-Id"] == job_id


def test_resume_answered_503_names_the_job(own_redis: RedisServer, svc: Service) -> None:
    with svc.client("alice") as alice:
        job_id = alice.post("/v1/jobs", json=smoke_spec()).json()["id"]
        assert alice.post(f"/v1/jobs/{job_id}/pause").json()["status"] == "paused"
        timer = pause_writes(own_redis, STALL_SECONDS)
        answer = alice.post(f"/v1/jobs/{job_id}/resume")
        timer.join()
        assert answer.status_code == 503, answer.text
        assert answer.headers["Pdppo-Job-Id"] == job_id


def test_an_upload_answered_503_names_the_file(own_redis: RedisServer, svc: Service) -> None:
    with svc.client("alice") as alice:
        timer = pause_writes(own_redis, STALL_SECONDS)
        answer = _upload(alice)
        timer.join()
        assert answer.status_code == 503, answer.text
        file_id = answer.json()["file_id"]
        assert answer.headers["Pdppo-File-Id"] == file_id
        # Once the store answers, uploading the same bytes again is that file, never a second.
        again = _upload(alice)
        assert again.json()["id"] == file_id
        assert [f["id"] for f in alice.get("/v1/files").json()["items"]] == [file_id]


def test_a_read_answered_503_names_nothing(own_redis: RedisServer, svc: Service) -> None:
    """A lookup that timed out wrote nothing: its 503 must not send the client looking."""
    with svc.client("alice") as alice:
        job_id = alice.post("/v1/jobs", json=smoke_spec()).json()["id"]
        sleeper = stall(own_redis, STALL_SECONDS)
        answer = alice.post(f"/v1/jobs/{job_id}/cancel")  # its lookup meets the stall first
        sleeper.join(STALL_SECONDS + 30)
        assert answer.status_code == 503
        assert "job_id" not in answer.json()
        assert "Pdppo-Job-Id" not in answer.headers
        assert alice.get(f"/v1/jobs/{job_id}").json()["status"] == "queued"


@pytest.mark.parametrize(
    ("method", "expect"),
    [
        ("cancel", lambda job: job.status == "cancelled"),
        ("pause", lambda job: job.status == "paused"),
    ],
)
def test_the_client_retries_job_writes_through_the_stall(
    own_redis: RedisServer, svc: Service, method: str, expect: Callable[[Any], bool]
) -> None:
    with Client(svc.base_url, KEYS["alice"], retry_seconds=30, max_retry_delay=0.5) as client:
        job = client.submit(smoke_spec())
        timer = pause_writes(own_redis, STALL_SECONDS)
        after = getattr(client, method)(job.id)
        timer.join()
        assert expect(after), after
        assert expect(client.get(job.id))


def test_pdppo_submit_rides_out_the_stall_with_one_job(
    own_redis: RedisServer, svc: Service
) -> None:
    warm_up(svc)
    env = {**svc.env, "PDPPO_URL": svc.base_url, "PDPPO_API_KEY": KEYS["alice"]}
    sleeper = stall(own_redis, STALL_SECONDS)
    done = subprocess.run(
        [*pdppo_command(), "submit", str(REPO / "examples" / "smoke.yaml")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    sleeper.join(STALL_SECONDS + 30)
    assert done.returncode == 0, done.stderr
    assert tenant_job_ids(svc) == [done.stdout.strip()]


def held_service(
    redis: RedisServer, root: Path, pattern: re.Pattern[bytes]
) -> tuple[HoldingProxy, Service]:
    """An API (not started) whose Redis is reached through a proxy holding `pattern` back."""
    proxy = HoldingProxy(redis.port, pattern, STALL_SECONDS)
    env = {"PDPPO_REDIS_SOCKET_TIMEOUT_SECONDS": STORE_TIMEOUT, "PDPPO_REDIS_URL": proxy.url(0)}
    return proxy, Service(redis, root / "service", env=env)


# two arms of one seed, on the gpu queue: no worker runs, so the children stay queued
EXPERIMENT = {
    "base": smoke_spec() | {"resources": {"device": "gpu"}},
    "grid": {"algorithm.mask": ["predictive", "dppo"]},
    "seeds": 1,
}


def stalled_create(alice: httpx.Client, key: dict[str, str]) -> httpx.Response:
    """POST /v1/experiments while a write is held: a 503, answered at the store timeout."""
    started = time.monotonic()
    answer = alice.post("/v1/experiments", json=EXPERIMENT, headers=key)
    took = time.monotonic() - started
    assert answer.status_code == 503, answer.text
    assert took < STALL_SECONDS, took
    return answer


# the command that records a created child as the experiment's (`AsyncExperimentStore.add_run`)
RECORD_CHILD = re.compile(rb"HSET\r\n\$\d+\r\n[^\r]*:experiment:[0-9a-f]+:runs\r\n")


def test_an_experiment_answered_503_names_its_child_and_its_retry_makes_the_rest(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    """The store stops answering once the experiment's first child is created (the write that
    records it is held back past the store timeout): the 503 names that child and says what a
    retry with the same Idempotency-Key does, as POST /v1/jobs's does, and the retry does it:
    the experiment, with the named child and the one not made yet, and no second of either."""
    proxy, service = held_service(own_redis, tmp_path, RECORD_CHILD)
    key = {"Idempotency-Key": "exp-stalled"}
    try:
        service.start_api()
        with service.client("alice") as alice:
            answer = stalled_create(alice, key)
            child = answer.json()["job_id"]
            assert answer.headers["Pdppo-Job-Id"] == child
            assert answer.json()["detail"] == (
                f"the job store did not answer in time; the creation of job {child} may still "
                f"take effect when it does (GET /v1/jobs/{child} tells, once it answers), and a "
                "retry with the same Idempotency-Key returns the experiment and makes its "
                "missing children, never a second of any"
            )
            assert tenant_job_ids(service) == [child]  # the first child, and only it

            proxy.wait_released()
            again = alice.post("/v1/experiments", json=EXPERIMENT, headers=key)
            assert again.status_code == 201, again.text
            assert again.headers["Idempotent-Replayed"] == "true"
            made = [run["job_id"] for arm in again.json()["arms"] for run in arm["runs"]]
            assert made[0] == child and len(made) == 2
            assert sorted(tenant_job_ids(service)) == sorted(made)
    finally:
        service.stop()
        proxy.close()
    assert proxy.held >= 1


# the script that writes the experiment's record (`AsyncExperimentStore.begin`): its first key is
# alice's experiment (bob's, in the warm-up, is not held)
RECORD_EXPERIMENT = re.compile(
    rb"EVALSHA\r\n\$40\r\n[0-9a-f]{40}\r\n\$1\r\n3\r\n\$\d+\r\n[^\r]*:tenant:alice:experiment:"
)


def test_an_experiment_whose_record_write_is_answered_503_is_named_and_found_by_its_retry(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    """The store stops answering while the experiment's own record is written, before any
    child: the 503 names the experiment (body and `Pdppo-Experiment-Id`), the record lands when
    the store answers again, and the retry with the same Idempotency-Key returns that one with
    its children, not a second experiment. Before, this 503 named nothing, as if nothing had
    been written."""
    proxy, service = held_service(own_redis, tmp_path, RECORD_EXPERIMENT)
    key = {"Idempotency-Key": "exp-record-stalled"}
    try:
        service.start_api()
        with service.client("bob") as bob:  # loads the scripts (see `warm_up`)
            assert bob.post("/v1/experiments", json=EXPERIMENT).status_code == 201
        with service.client("alice") as alice:
            answer = stalled_create(alice, key)
            named = answer.json()["experiment_id"]
            assert answer.headers["Pdppo-Experiment-Id"] == named
            assert "job_id" not in answer.json() and "Pdppo-Job-Id" not in answer.headers
            assert answer.json()["detail"] == (
                f"the job store did not answer in time; the creation of experiment {named} may "
                f"still take effect when it does (GET /v1/experiments/{named} tells, once it "
                "answers), and a retry with the same Idempotency-Key returns the experiment and "
                "makes its missing children, never a second of any"
            )
            assert tenant_job_ids(service) == []  # no child yet

            proxy.wait_released()
            assert alice.get(f"/v1/experiments/{named}").status_code == 200  # it landed
            again = alice.post("/v1/experiments", json=EXPERIMENT, headers=key)
            assert again.status_code == 201, again.text
            assert again.headers["Idempotent-Replayed"] == "true"
            assert again.json()["id"] == named
            made = [run["job_id"] for arm in again.json()["arms"] for run in arm["runs"]]
            assert len(made) == 2 and sorted(tenant_job_ids(service)) == sorted(made)
            listed = alice.get("/v1/experiments").json()["items"]
            assert [e["id"] for e in listed] == [named]
    finally:
        service.stop()
        proxy.close()
    assert proxy.held >= 1


NEVER = re.compile(rb"(?!)")  # a proxy that holds nothing back, until told what to hold
CHANGE = {"train": {"optim": {"lr": 0.0003}}}
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}


def job_change_script(job_id: str) -> re.Pattern[bytes]:
    """The script that stores a change of `job_id` (`AsyncSteering.patch`: its two keys, the
    job's hash and its events)."""
    return re.compile(
        rb"EVALSHA\r\n\$40\r\n[0-9a-f]{40}\r\n\$1\r\n2\r\n\$\d+\r\n[^\r]*:job:"
        + job_id.encode()
        + rb"\r\n"
    )


@pytest.mark.parametrize("how", ["client", "cli"])
def test_a_change_retried_after_its_503_is_made_once(
    own_redis: RedisServer, tmp_path: Path, how: str
) -> None:
    """The store stops answering while a change is written (the script is held back past the
    store timeout): the PATCH answers 503, the change lands when the store answers again, and
    the client's retry (`Client.change`, `pdppo set`), sent after that, must not make it a
    second time. Before, the retry was a new change computed over the first one: the job's
    config_version went up by 2 and its log said "config change 2 requested" too. Now each
    attempt carries the version it was computed from (`If-Match`), and the retry's 412 finds
    the change made."""
    proxy, service = held_service(own_redis, tmp_path, NEVER)
    try:
        service.start_api()
        with service.client("bob") as bob:  # loads the change's script (see `warm_up`)
            other = bob.post("/v1/jobs", json=smoke_spec()).json()["id"]
            changed = bob.patch(f"/v1/jobs/{other}", json=CHANGE, headers=MERGE_PATCH)
            assert changed.status_code == 200, changed.text
        with service.client("alice") as alice:
            job_id = alice.post("/v1/jobs", json=smoke_spec()).json()["id"]
        proxy.pattern = job_change_script(job_id)
        if how == "client":
            with Client(service.base_url, KEYS["alice"], retry_seconds=60) as client:
                answer = client.change(job_id, CHANGE)
            assert answer.config_version == 1
        else:
            env = {**service.env, "PDPPO_URL": service.base_url, "PDPPO_API_KEY": KEYS["alice"]}
            done = subprocess.run(
                [*pdppo_command(), "set", job_id, "optim.lr=0.0003"],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
            assert done.stdout.strip() == f"{job_id} queued config_version=1"
        with service.client("alice") as alice:
            after = alice.get(f"/v1/jobs/{job_id}").json()
    finally:
        service.stop()
        proxy.close()
    assert proxy.held >= 1  # the change was held back: its first answer was the 503
    assert (after["config_version"], after["overrides"]) == (1, CHANGE)
    log = redis.Redis.from_url(own_redis.url(0), decode_responses=True).xrange(events_key(job_id))
    said = [json.loads(f["data"])["message"] for _, f in log if f["type"] == "log"]
    assert [m.split(" (")[0] for m in said] == ["config change 1 requested"], said
