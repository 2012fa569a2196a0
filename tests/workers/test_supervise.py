"""The worker's loop around a running job (`workers.job.runner._supervise`) and the claim before it
(`run_job`), with a real Redis and a real job process from the fork server that stands in for
training (`tests.workers.job_stand_ins`). The same loop with real training and a real Celery
worker: tests/integration."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import pytest
import redis

from pdppo.settings import Settings
from pdppo.store import JobStore, StoreRetry, job_key, now_iso
from tests.support.stack import RedisServer
from tests.workers import job_stand_ins
from tests.workers.held import RETRY, SETTINGS, Held
from workers.job import runner
from workers.job.lease import lease_key
from workers.job.runner import POLL_SECONDS, _Outcome


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(runner, "job_main", job_stand_ins.finish_after_two_seconds)
    monkeypatch.setattr(runner, "job_dir", lambda job_id: tmp_path / job_id)


def test_the_worker_looks_at_its_job_every_poll(
    held: Held, stand_in: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each look checks the lease (and the cancel flag's, timeout's and shutdown's news): a lost
    lease or a cancel is acted on within POLL_SECONDS, and the loop does not spin a core."""
    looks: list[float] = []
    check = held.lease.check

    def counted() -> None:
        looks.append(time.monotonic())
        check()

    monkeypatch.setattr(held.lease, "check", counted)
    outcome = runner._supervise(held.store, RETRY, held.job, held.lease, SETTINGS)
    assert outcome == _Outcome("succeeded at step 3")
    assert held.field("status") == "succeeded"
    # from the job's start (a fork server's first start takes seconds) to its end: 2 s of looks
    gaps = sorted(later - sooner for sooner, later in itertools.pairwise(looks))
    assert len(gaps) >= 5, looks
    assert 0.5 * POLL_SECONDS <= gaps[len(gaps) // 2] <= 1.5 * POLL_SECONDS, gaps


def test_a_job_that_ends_while_redis_is_gone_is_left_to_expire_and_resume(
    server: RedisServer, held: Held, stand_in: None, caplog: pytest.LogCaptureFixture
) -> None:
    """The end cannot be recorded: the worker says so and leaves the job running with its lease
    to expire (a reaper resumes it from its last checkpoint); it does not raise into Celery."""
    threading.Timer(0.5, server.stop).start()
    with caplog.at_level("ERROR", logger="workers.job.runner"):
        outcome = runner._supervise(held.store, StoreRetry(1.0), held.job, held.lease, SETTINGS)
    assert outcome == _Outcome("abandoned: Redis unreachable")
    [error] = [r.getMessage() for r in caplog.records if r.name == "workers.job.runner"]
    assert error.startswith("job j1: ") and error.endswith("; leaving it to expire and be resumed")


def test_a_claim_stalled_past_the_lease_leaves_the_job_alone(
    server: RedisServer, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past its lease this worker may no longer be the only one at the job: it gives up without
    running it or writing to it, and the job stays queued for its task's next holder."""
    fields = {"id": "j2", "tenant": "t", "status": "queued", "queue": "cpu", "spec": "{}"}
    client.hset(job_key("j2"), mapping={**fields, "created_at": now_iso()})
    monkeypatch.setattr(runner, "get_settings", lambda: Settings(lease_seconds=1))
    monkeypatch.setattr(runner, "redis_client", lambda: client)

    def stalled(self: JobStore, job_id: str, worker: str) -> bool:
        time.sleep(1.2)  # a whole lease without a reply
        raise redis.TimeoutError("Timeout reading from socket")

    monkeypatch.setattr(JobStore, "claim", stalled)
    assert runner.run_job("j2") == "abandoned: lease lost"
    assert client.hget(job_key("j2"), "status") == "queued"
    assert client.exists(lease_key("j2")) == 0


def test_the_worker_has_one_redis_client() -> None:
    """Jobs and the reaper share one client and its connection pool: a client per job would
    leave a pool of idle connections behind each one."""
    runner.redis_client.cache_clear()
    try:
        assert runner.redis_client() is runner.redis_client()
    finally:
        runner.redis_client.cache_clear()


@pytest.mark.parametrize(
    ("flag", "told"),
    [("pause_requested", "kept"), ("cancel_requested", "cancelled"), (None, "kept")],
    ids=["pause", "cancel", "shutdown"],
)
def test_the_job_hears_whether_its_stop_keeps_the_work(
    held: Held,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    flag: str | None,
    told: str,
) -> None:
    """A pause or a worker shutdown lets the job finish the step it is in and checkpoint it
    (`TrainerCallback.stop_keeps_work`); a cancel, which keeps nothing, tells it so."""
    monkeypatch.setattr(runner, "job_main", job_stand_ins.report_the_stop)
    monkeypatch.setattr(runner, "job_dir", lambda job_id: tmp_path / job_id)
    if flag is None:
        monkeypatch.setattr(runner, "SHUTTING_DOWN", threading.Event())
        runner.SHUTTING_DOWN.set()
    else:
        held.client.hset(job_key(held.job.id), flag, "1")
    runner._supervise(held.store, RETRY, held.job, held.lease, SETTINGS)
    assert (tmp_path / held.job.id / "stop.txt").read_text() == told
