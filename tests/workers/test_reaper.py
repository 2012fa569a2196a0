"""The reaper (`workers.upkeep.reaper`) on a real Redis: what one pass reaps, and its hold after an
outage.

After Redis was away (`start_reaper`'s `outage_hold`): every lease expires in a stall longer than
the lease, but the holders are alive: each hands its job back itself, saying why. A reaper that
reaped first would count a lost worker against each job (enough of them fail it), so after an outage
it holds off for a lease period. The tests make the orphan right after the stall, so only the hold
keeps it running, and also wait for the reap the hold only delays. The task's send is stood in for
(Celery's `send_task`; the requeue itself is the store's script, which is what the job's status
shows)."""

from __future__ import annotations

import time

import pytest
import redis

from pdppo.store import RUNNING_SET, JobStore, job_key
from tests.support.seed import running_job
from tests.support.stack import RedisServer, stall
from workers.job.lease import Lease
from workers.upkeep.reaper import DispatchTiming, reap_once, start_reaper

HOLD = 1.5
TICK = 0.5  # the reap interval: longer than the 0.3 s timeout of a failing ping


def status_over(client: redis.Redis, job_id: str, seconds: float) -> list[tuple[float, str]]:
    """(seconds since the call, status) whenever the job's status changes, for `seconds`."""
    started = time.monotonic()
    seen: list[tuple[float, str]] = []
    while (now := time.monotonic() - started) < seconds:
        status = str(client.hget(job_key(job_id), "status"))
        if not seen or seen[-1][1] != status:
            seen.append((now, status))
        time.sleep(0.02)
    return seen


@pytest.mark.parametrize(
    "timeout",
    [
        # Each ping in the stall times out (an error), and one sent near its end is answered
        # within the timeout, faster than a tick: only the failures say that Redis was away.
        pytest.param(0.3, id="ping-failed"),
        # The ping waits the stall out: no error, but an answer slower than a tick.
        pytest.param(5.0, id="ping-slow"),
    ],
)
def test_after_redis_was_away_the_reaper_holds_off_for_a_lease_period(
    server: RedisServer, sent: list[tuple[str, str]], timeout: float
) -> None:
    client = redis.Redis.from_url(server.url(), socket_timeout=timeout, decode_responses=True)
    store = JobStore(client)
    stop = start_reaper(store, interval=TICK, max_worker_losses=0, outage_hold=HOLD)
    try:
        stall(server, 1.5).join()  # a ping starts at most a tick into it
        running_job(client, "orphan")  # running, and nobody holds its lease
        seen = status_over(client, "orphan", HOLD + 3 * TICK + 1.0)
    finally:
        stop.set()
    assert [s for _, s in seen] == ["running", "queued"], seen
    requeued_at = seen[1][0]
    # Held from the first ping that answered (a tick or so after the stall), then reaped at the
    # next tick; without the hold, within a tick or two.
    assert HOLD - 0.1 <= requeued_at <= HOLD + 3 * TICK + 0.3, seen
    assert sent == [("orphan", "cpu")]


def test_without_an_outage_an_orphan_is_reaped_at_the_next_tick(
    client: redis.Redis, sent: list[tuple[str, str]]
) -> None:
    """The hold is for outages only: a worker that died is replaced within an interval."""
    store = JobStore(client)
    stop = start_reaper(store, interval=TICK, max_worker_losses=0, outage_hold=HOLD)
    try:
        time.sleep(TICK + 0.1)
        running_job(client, "orphan")
        seen = status_over(client, "orphan", 1.5)
    finally:
        stop.set()
    assert [s for _, s in seen] == ["running", "queued"], seen
    assert seen[1][0] <= TICK + 0.3, seen
    assert sent == [("orphan", "cpu")]


def test_one_pass_requeues_orphans_only_and_drops_running_entries_without_a_job(
    client: redis.Redis, sent: list[tuple[str, str]]
) -> None:
    store = JobStore(client)
    running_job(client, "orphan")
    alive = running_job(client, "alive")
    assert Lease(client, alive.id, seconds=30, owner="w1").acquire()
    client.sadd(RUNNING_SET, "ghost")  # its record gone (expired, deleted by hand)
    assert reap_once(store, max_worker_losses=0) == ["orphan"]
    assert sent == [("orphan", "cpu")]
    assert client.smembers(RUNNING_SET) == {"alive"}
    assert client.hget(job_key("orphan"), "status") == "queued"
    assert client.hget(job_key("alive"), "status") == "running"


def test_one_pass_fails_a_job_past_max_worker_losses_and_0_sets_no_limit(
    client: redis.Redis, sent: list[tuple[str, str]], caplog: pytest.LogCaptureFixture
) -> None:
    """The reaper passes the server's `max_worker_losses` on: with 1, the second worker that dies
    on a job fails it (and sends no task); with 0, a job is requeued however often it is lost."""
    store = JobStore(client)
    for _ in range(3):
        running_job(client, "unlimited")
        assert reap_once(store, max_worker_losses=0) == ["unlimited"]
    assert client.hget(job_key("unlimited"), "status") == "queued"
    running_job(client, "limited")
    assert reap_once(store, max_worker_losses=1) == ["limited"]
    running_job(client, "limited")
    caplog.clear()
    with caplog.at_level("WARNING", logger="workers.upkeep.reaper"):
        assert reap_once(store, max_worker_losses=1) == []
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("ERROR", "job limited lost its worker too often; marked failed")
    ]
    assert client.hget(job_key("limited"), "status") == "failed"
    assert client.hget(job_key("limited"), "error_message") == (
        "the job's worker died 2 times while running it (killed, out of memory, or lost its "
        "machine); not retried again"
    )
    assert sent == [("unlimited", "cpu")] * 3 + [("limited", "cpu")]


def test_the_reaper_passes_every_interval_whatever_the_dispatchers_tick(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass reads every running job, so the dispatcher's short tick (0.1 s here) must not make
    the reaper pass more often than its interval (1 s): the first pass is an interval after the
    start, the next an interval after that. The outbox adoption, though, is done at once."""
    store = JobStore(client)
    started = time.monotonic()
    passes: list[float] = []
    adoptions: list[float] = []

    def reap_once_timed(*args: object, **kwargs: object) -> list[str]:
        passes.append(time.monotonic() - started)
        return []

    def adopt_timed() -> int:
        adoptions.append(time.monotonic() - started)
        return 0

    monkeypatch.setattr("workers.upkeep.reaper.reap_once", reap_once_timed)
    monkeypatch.setattr(store.outbox, "adopt_queued", adopt_timed)
    timing = DispatchTiming(grace=0.2, claim_grace=1.0, recheck=1.0)
    stop = start_reaper(store, interval=1.0, max_worker_losses=0, outage_hold=0.0, timing=timing)
    time.sleep(2.5)
    stop.set()
    assert len(passes) == 2, passes
    # a pass is timed inside it, after the loop scheduled it (a Redis round trip and the thread's
    # wake-up later, 0.09 s on a loaded CI machine): apart by the interval less that, and never
    # by the dispatcher's tick, which is what this guards
    assert passes[0] >= 1.0 and passes[1] - passes[0] >= 1.0 - 0.1, passes
    assert len(adoptions) == 1 and adoptions[0] < timing.interval, adoptions


def test_a_bug_in_one_tick_is_logged_with_its_traceback_and_the_loop_goes_on(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Not a Redis error: a bug (here the dispatcher's first pass raising). The thread must not
    die of it, or no orphan would ever be requeued on this worker again."""
    calls: list[float] = []

    def dispatch_once_buggy(*args: object, **kwargs: object) -> list[str]:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise ValueError("a bug")
        return []

    monkeypatch.setattr("workers.upkeep.reaper.dispatch_once", dispatch_once_buggy)
    timing = DispatchTiming(grace=0.2, claim_grace=1.0, recheck=1.0)
    with caplog.at_level("WARNING", logger="workers.upkeep.reaper"):
        stop = start_reaper(
            JobStore(client), interval=60.0, max_worker_losses=0, outage_hold=0.0, timing=timing
        )
        time.sleep(0.5)
        stop.set()
    assert len(calls) >= 2, calls
    (record,) = [r for r in caplog.records if r.getMessage() == "dispatcher failed; retrying"]
    assert record.levelname == "ERROR"
    assert record.exc_info is not None and record.exc_info[0] is ValueError
