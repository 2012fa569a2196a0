"""The lease through a Redis stall: kept through one shorter than the lease, lost (and saying
that Redis was unreachable) through one longer."""

from __future__ import annotations

import itertools
import re
import time

import pytest
import redis

from pdppo.store import lease_key
from tests.support.stack import RedisServer, stall
from tests.workers.renewals import record_renewals
from workers.job.lease import Lease, LeaseLost


def test_the_heartbeat_renews_six_times_per_lifetime(client: redis.Redis) -> None:
    """The stall a lease survives, whenever it starts (five sixths of it less a second: 24 s of
    the default 30, workers.job.lease's promise), is computed from this cadence: renewals a sixth
    of a lifetime apart. Fewer would break the promise; more would load Redis for nothing."""
    lease = Lease(client, "j0", seconds=2.4, owner="w1")
    assert lease.acquire()
    started = record_renewals(lease)
    lease.start_heartbeat()
    try:
        time.sleep(2.7)
    finally:
        lease.release()
    gaps = sorted(b - a for a, b in itertools.pairwise(started))
    assert len(started) >= 5, started
    assert 0.39 <= gaps[len(gaps) // 2] <= 0.45, gaps  # 2.4 s / 6; 5 or 7 would be 0.48, 0.34


def test_a_lease_lives_its_configured_seconds_in_redis(client: redis.Redis) -> None:
    """The reaper hands a job on once its lease key expires, and the job's fence sizes its
    checkpoint margin from `seconds`: both must be the configured lifetime."""
    lease = Lease(client, "j5", seconds=30, owner="w1")
    assert lease.seconds == 30
    assert lease.acquire()
    assert 29_900 <= client.pttl(lease_key("j5")) <= 30_000
    client.pexpire(lease_key("j5"), 1000)
    assert lease.renew()
    assert 29_900 <= client.pttl(lease_key("j5")) <= 30_000


def test_a_holder_that_stopped_renewing_is_not_blamed_on_redis(client: redis.Redis) -> None:
    """No renewal failed and none is waiting for Redis: the holder itself went quiet (a frozen
    process, a dead heartbeat), so the lease is lost as such, and the job is not handed back
    as if Redis had stranded it."""
    lease = Lease(client, "j6", seconds=0.5, owner="w1")
    assert lease.acquire()  # and no heartbeat
    time.sleep(0.6)
    with pytest.raises(LeaseLost) as lost:
        lease.check()
    assert lost.value.unreachable is False
    assert lease.lost_reason.startswith("not renewed for ")


def test_a_stall_shorter_than_the_lease_keeps_it(
    server: RedisServer, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # Renewals every 0.5 s; the 2 s stall times out every one of them (0.3 s socket timeout).
    lease = Lease(client, "j1", seconds=3, owner="w1")
    assert lease.acquire()
    lease.start_heartbeat()
    try:
        time.sleep(0.6)
        stall(server, 2.0).join()
        deadline = time.monotonic() + 2
        while client.pttl(lease_key("j1")) < 2500 and time.monotonic() < deadline:
            time.sleep(0.05)  # renewed again within moments of Redis waking
        assert client.pttl(lease_key("j1")) >= 2500
        lease.check()
        assert not lease.lost.is_set()
        assert client.get(lease_key("j1")) == lease.token
        # The first renewal in the stall was due 0.4 s into it: failing for about 1.6 s (the
        # heartbeat logs it a moment after the renewal that the loop above saw).
        deadline = time.monotonic() + 2
        while not (again := re.search(r"renewed again after ([\d.]+)s", caplog.text)):
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.01)
        assert 1.0 <= float(again[1]) <= 2.5, again[0]
    finally:
        lease.release()


def test_a_stall_longer_than_the_lease_loses_it_as_unreachable(
    server: RedisServer, client: redis.Redis
) -> None:
    lease = Lease(client, "j2", seconds=1, owner="w1")
    assert lease.acquire()
    lease.start_heartbeat()
    try:
        sleeper = stall(server, 2.0)
        deadline = time.monotonic() + 5
        while not lease.lost.is_set() and time.monotonic() < deadline:
            try:
                lease.check()
            except LeaseLost:
                break
            time.sleep(0.05)
        with pytest.raises(LeaseLost) as raised:
            lease.check()
        assert raised.value.unreachable
        assert lease.unreachable
        assert lease.lost_reason.startswith("not renewed for")
        sleeper.join()
        assert client.get(lease_key("j2")) is None  # expired in Redis meanwhile
    finally:
        lease.release()


def test_a_heartbeat_that_finds_its_lease_expired_after_a_stall_blames_redis(
    server: RedisServer, client: redis.Redis
) -> None:
    """Nobody checked the lease during the stall: the heartbeat's first renewal after it finds
    the key gone, and since its renewals went unanswered for a whole lifetime, Redis is why."""
    lease = Lease(client, "j4", seconds=1, owner="w1")
    assert lease.acquire()
    lease.start_heartbeat()
    try:
        stall(server, 2.0).join()
        assert lease.lost.wait(2.0)
        assert lease.lost_reason.startswith("expired after "), lease.lost_reason
        assert lease.unreachable is True
    finally:
        lease.release()


def test_a_lease_taken_over_is_not_blamed_on_redis(client: redis.Redis) -> None:
    lease = Lease(client, "j3", seconds=2, owner="w1")
    assert lease.acquire()
    lease.start_heartbeat()
    try:
        client.set(lease_key("j3"), "someone-else")
        deadline = time.monotonic() + 3
        while not lease.lost.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(LeaseLost) as raised:
            lease.check()
        assert not raised.value.unreachable
        assert lease.lost_reason == "taken over or deleted"
    finally:
        lease.release()


def test_acquire_through_a_stall_takes_the_lease_once(
    server: RedisServer, client: redis.Redis
) -> None:
    """A SET NX that timed out runs when Redis wakes; the retry must not then take the lease for
    somebody else's."""
    lease = Lease(client, "j4", seconds=30, owner="w1")
    sleeper = stall(server, 1.5)
    assert lease.acquire()
    sleeper.join()
    assert client.get(lease_key("j4")) == lease.token
    other = Lease(client, "j4", seconds=30, owner="w2")
    assert not other.acquire()
    lease.release()
