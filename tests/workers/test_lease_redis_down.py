"""The lease and the fence when Redis is down (every command refused at once), as opposed to
stalled (tests/workers/test_lease_stall.py, where each command waits for its timeout): the
lease is lost only once a whole lifetime has passed without a renewal, and it is blamed on
Redis (`unreachable`), so the worker leaves the job to be resumed rather than failing it."""

from __future__ import annotations

import itertools
import time

import pytest
import redis

from pdppo.store import lease_key
from tests.support.stack import RedisServer
from tests.workers.renewals import record_renewals
from workers.job.lease import Lease, LeaseFence, LeaseLost


def renewing_then_down(
    server: RedisServer, client: redis.Redis, seconds: float
) -> tuple[Lease, list[float]]:
    """A lease held and renewed through `client` on `server`, which is then stopped; and its
    renewals' start times (`record_renewals`). The caller stops the heartbeat."""
    lease = Lease(client, "j1", seconds=seconds, owner="w1")
    assert lease.acquire()
    renewals = record_renewals(lease)
    lease.start_heartbeat()
    server.stop()
    return lease, renewals


def test_renewals_refused_by_a_redis_that_is_down_lose_the_lease_as_unreachable(
    server: RedisServer, client: redis.Redis
) -> None:
    """Refused renewals fail in a moment, so between them no renewal is waiting for a reply:
    only the first failure's time (`_failing_since`) says that Redis is why none succeeded.
    They are retried with a backoff of up to a renewal interval (1/6 s here), not in a loop
    that would spin a core against a server that is down."""
    lease, renewals = renewing_then_down(server, client, seconds=1)
    try:
        time.sleep(0.5)
        lease.check()  # half a lifetime without a renewal: still held
        time.sleep(0.8)
        with pytest.raises(LeaseLost) as lost:
            lease.check()
        assert lost.value.unreachable, lease.lost_reason
        assert lease.lost_reason.startswith("not renewed for ")
        assert 3 <= len(renewals) <= 40, renewals  # 1.3 s at 0.05 s to 1/6 s apart
    finally:
        lease.stop_heartbeat()


def test_failed_renewals_are_retried_within_moments_and_never_a_second_apart(
    server: RedisServer, client: redis.Redis
) -> None:
    """The lease's stall promise (five sixths of it less a second) holds because a failed
    renewal is retried with a backoff that starts at 0.05 s and is capped at a second, not a
    renewal interval later (2 s for this 12 s lease; 5 s for the default 30 s)."""
    lease, renewals = renewing_then_down(server, client, seconds=12)
    try:
        time.sleep(2.0 + 5.0)  # the first renewal, due at 2 s, fails; then 5 s of retries
    finally:
        lease.stop_heartbeat()
    gaps = [b - a for a, b in itertools.pairwise(renewals)]
    assert len(gaps) >= 6, renewals
    assert gaps[0] < 0.3, gaps  # 0.025 to 0.05 s after the first failure
    assert max(gaps) <= 1.15, gaps


def test_the_fence_holds_its_lease_until_it_expires_while_redis_is_down(
    server: RedisServer, client: redis.Redis
) -> None:
    """The job process's fence reads the lease every lifetime / 6: reads that fail while the
    lease is known to last do not lose it; past its expiry they do, blamed on Redis."""
    client.set(lease_key("j2"), "w1:abc", px=2000)
    fence = LeaseFence(client, "j2", "w1:abc", seconds=2)
    assert fence.check()
    fence.start()
    try:
        server.stop()
        time.sleep(1.0)  # three failed reads, the lease known to last 1 s more
        assert not fence.lost.is_set(), fence.reason
        assert fence.lost.wait(1.6)  # the first read past its expiry, a third of a second on
        assert fence.unreachable
        assert fence.reason.startswith("could not be read past its expiry")
    finally:
        fence.stop()


def test_the_checkpoint_gate_waits_out_a_known_lease_then_refuses_blaming_redis(
    server: RedisServer, client: redis.Redis
) -> None:
    """A checkpoint is due with less than the margin of the lease known and Redis down: the gate
    neither writes (the lease might pass mid-write) nor gives up while the lease may still be
    renewed; it retries until the lease it knew of has run out, then refuses, blamed on Redis."""
    client.set(lease_key("j3"), "w1:abc", px=2000)
    fence = LeaseFence(client, "j3", "w1:abc", seconds=2)  # a checkpoint needs 1 s left
    assert fence.check()
    server.stop()
    time.sleep(1.2)
    left = fence.held_for
    assert 0.3 < left < 1.0, left
    started = time.monotonic()
    with pytest.raises(LeaseLost) as lost:
        fence.ensure_held()
    waited = time.monotonic() - started
    assert left - 0.05 <= waited < left + 1.0, (left, waited)
    assert lost.value.unreachable is True
    assert fence.reason.startswith("could not be read past its expiry"), fence.reason


def test_releasing_while_redis_is_down_leaves_the_lease_to_expire(
    server: RedisServer, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The job is over (handed back or finished) when the lease is released: a release that
    Redis refuses must not turn that outcome into an error; the key expires by itself."""
    lease = Lease(client, "j4", seconds=1, owner="w1")
    assert lease.acquire()
    lease.start_heartbeat()
    server.stop()
    with caplog.at_level("WARNING", logger="workers.job.lease"):
        lease.release()
    assert lease._thread is not None and not lease._thread.is_alive()
    (record,) = [r for r in caplog.records if r.getMessage().startswith("could not release")]
    assert record.getMessage() == "could not release pdppo:job:j4:lease; it expires by itself"
    assert record.exc_info and record.exc_info[0] is redis.ConnectionError  # why, in the log
