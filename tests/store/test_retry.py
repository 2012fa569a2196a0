"""`pdppo.store.retry` against a real redis-server that stalls, stops and restarts."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import cast

import pytest
import redis

from pdppo.store import StoreRetry, StoreUnavailable, events_key, is_transient
from pdppo.store.retry import add_event_once, log_fields, publish_log_once
from tests.support import stack
from tests.support.stack import RedisServer, stall


class Counted:
    """Counts the calls of a store operation."""

    def __init__(self, client: redis.Redis, command: str, *args: object) -> None:
        self.client, self.command, self.args = client, command, args
        self.calls = 0

    def __call__(self) -> object:
        self.calls += 1
        return self.client.execute_command(self.command, *self.args)


def test_a_stall_longer_than_the_socket_timeout_is_ridden_out(
    server: RedisServer, client: redis.Redis
) -> None:
    client.set("k", "v")
    get = Counted(client, "GET", "k")
    sleeper = stall(server, 1.5)
    started = time.monotonic()
    assert StoreRetry(30, base=0.05, cap=0.2).call("read k", get) == "v"
    took = time.monotonic() - started
    sleeper.join()
    assert get.calls >= 3  # each attempt waits 0.3 s for its reply, then backs off
    assert 1.0 <= took < 5, took


def test_a_stopped_server_is_tried_exactly_max_attempts_times_with_growing_waits(
    server: RedisServer, client: redis.Redis
) -> None:
    server.stop()
    get = Counted(client, "GET", "k")
    waits: list[float] = []
    retry = StoreRetry(60, base=0.1, cap=0.3, max_attempts=4, sleep=waits.append)
    with pytest.raises(StoreUnavailable) as raised:
        retry.call("read k", get)
    assert get.calls == 4
    assert raised.value.attempts == 4
    assert isinstance(raised.value.cause, redis.ConnectionError)
    assert isinstance(raised.value, redis.RedisError)  # callers' `except RedisError` still holds
    assert len(waits) == 3  # between the attempts, none after the last
    # Half fixed, half jitter, doubling from `base`, capped at `cap`.
    assert 0.05 <= waits[0] <= 0.1
    assert 0.1 <= waits[1] <= 0.2
    assert 0.15 <= waits[2] <= 0.3


def test_gives_up_once_redis_has_been_away_for_the_outage(
    server: RedisServer, client: redis.Redis
) -> None:
    server.stop()
    get = Counted(client, "GET", "k")
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as raised:
        StoreRetry(0.6, base=0.05, cap=0.1).call("read k", get)
    took = time.monotonic() - started
    assert 0.6 <= raised.value.waited < 2
    assert 0.6 <= took < 2
    assert get.calls == raised.value.attempts >= 4


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("EVAL", ("return redis.error_reply('ERR boom')", 0)),  # a script's own error
        ("EVAL", ("return redis.call('INCR', KEYS[1])", 1, "text")),  # a script that breaks
        ("LPUSH", ("text", "x")),  # WRONGTYPE
    ],
)
def test_a_permanent_error_is_raised_at_once(
    client: redis.Redis, command: str, args: tuple[object, ...]
) -> None:
    client.set("text", "not a number")
    op = Counted(client, command, *args)
    waits: list[float] = []
    with pytest.raises(redis.ResponseError) as raised:
        StoreRetry(60, sleep=waits.append).call("run it", op)
    assert not is_transient(raised.value)
    assert op.calls == 1
    assert waits == []


def test_a_restarted_redis_is_reconnected_to(
    server: RedisServer, client: redis.Redis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.set("k", "before")
    server.stop()
    restarted: list[RedisServer] = []

    def restart() -> None:
        time.sleep(1.0)
        monkeypatch.setattr(stack, "free_port", lambda: server.port)
        restarted.append(RedisServer(tmp_path / "second"))

    thread = threading.Thread(target=restart)
    thread.start()
    try:
        write = Counted(client, "SET", "k", "after")
        assert StoreRetry(30, base=0.05, cap=0.2).call("write k", write) is True
        thread.join()
        assert write.calls >= 3
        assert client.get("k") == "after"  # the new server (no persistence: nothing before)
    finally:
        thread.join()
        for srv in restarted:
            srv.stop()


def test_recover_says_whether_a_failed_write_landed(
    server: RedisServer, client: redis.Redis
) -> None:
    """A write whose reply was lost is not sent again when `recover` finds it done."""
    sent: list[int] = []

    def write() -> str:
        sent.append(1)
        if len(sent) == 1:
            client.set("claimed", "yes")
            raise redis.TimeoutError("Timeout reading from socket")  # it landed, reply lost
        raise AssertionError("sent twice")

    def landed() -> str | None:
        return "done" if client.get("claimed") == "yes" else None

    assert StoreRetry(5, base=0.01).call("claim", write, recover=landed) == "done"
    assert sent == [1]


def test_before_retry_can_abandon_the_call(server: RedisServer, client: redis.Redis) -> None:
    server.stop()
    get = Counted(client, "GET", "k")

    class LeaseGone(Exception):
        pass

    def lease_check() -> None:
        if get.calls >= 2:
            raise LeaseGone

    with pytest.raises(LeaseGone):
        StoreRetry(60, base=0.01).call("read k", get, before_retry=lease_check)
    assert get.calls == 2


def test_a_log_line_lands_exactly_once_through_a_stall(
    server: RedisServer, client: redis.Redis
) -> None:
    """An XADD that timed out still runs when Redis wakes (it waits in the abandoned connection);
    a plain retry would add the line twice."""
    key = events_key("j1")
    client.xadd(key, {"type": "status", "data": "{}"})
    sleeper = stall(server, 1.5)
    publish_log_once(client, StoreRetry(30, base=0.05, cap=0.2), "j1", "resumed from step 10")
    sleeper.join()
    time.sleep(0.2)  # let any late copy run
    entries = cast(list[tuple[str, dict[str, str]]], client.xrange(key))
    logs = [fields for _, fields in entries if fields["type"] == "log"]
    assert len(logs) == 1, entries
    assert '"message": "resumed from step 10"' in logs[0]["data"]


def test_add_event_once_adds_a_repeated_entry_once_and_a_new_one_again(
    client: redis.Redis,
) -> None:
    retry = StoreRetry(5)
    line = log_fields("same words")
    assert add_event_once(client, retry, "j2", line) is True
    assert add_event_once(client, retry, "j2", line) is False  # a retry of the same line
    time.sleep(0.002)
    assert add_event_once(client, retry, "j2", log_fields("same words")) is True  # said again
    assert client.xlen(events_key("j2")) == 2
