"""`workers.consumer`: a lost broker connection whose task ack failed is torn down without the
AttributeError that made a worker exit (seen in CI, through `pdppo dev`'s Redis-restart test).

Real kombu on a real redis-server, in the shape a worker has at that moment: one channel
consuming the task queue, holding the delivered, unacknowledged task message with a BRPOP in
flight, and a second channel on a fanout exchange (Celery's broadcast consumer), created after it
and so closed first."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest
import redis
from celery.utils.imports import symbol_by_name
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu import Connection, Consumer, Exchange, Message, Queue

from tests.support.stack import RedisServer
from workers.celery_app import make_celery, side_app
from workers.consumer import Consumer as PdppoConsumer
from workers.consumer import hand_back_unacked

QUEUE = "cpu"


def deliver(
    server: RedisServer, in_flight: bool, broadcast_first: bool = False
) -> tuple[Connection, list[Message]]:
    """A connection holding one delivered, unacknowledged message of QUEUE; with `in_flight`, the
    next BRPOP is left waiting, as in a worker's event loop. The broadcast channel is made after
    the task channel (as Celery does), or before it."""
    with Connection(server.url()) as producer:
        producer.SimpleQueue(QUEUE).put({"job": "j1"})
    conn = Connection(server.url(), transport_options={"socket_timeout": 2})
    broadcast_channel = conn.channel() if broadcast_first else None
    messages: list[Message] = []
    tasks = Consumer(conn.default_channel, [Queue(QUEUE)], accept=["json"])
    tasks.register_callback(lambda body, message: messages.append(message))
    tasks.consume()
    broadcast = Consumer(
        broadcast_channel or conn.channel(),
        [Queue("bcast", Exchange("bcast", type="fanout"), auto_delete=True)],
        accept=["json"],
    )
    broadcast.consume()
    deadline = time.monotonic() + 10
    while not messages:  # a drain may first read the fanout subscription's confirmation
        assert time.monotonic() < deadline, "the task message was never delivered"
        conn.drain_events(timeout=5)
    assert len(messages) == 1
    if in_flight:
        with contextlib.suppress(TimeoutError):
            conn.drain_events(timeout=0.2)
    return conn, messages


def teardown(conn: Connection) -> None:
    """What Celery 5.7's `on_connection_error_after_connected` does to the lost connection."""
    conn.collect(socket_timeout=2)
    conn.close()


def redis_down_teardown(server: RedisServer, hand_back: bool) -> None:
    conn, messages = deliver(server, in_flight=True)
    server.proc.kill()
    server.proc.wait(10)
    with pytest.raises(redis.ConnectionError):
        messages[0].ack()
    if hand_back:
        assert hand_back_unacked(conn) == 1  # Redis is gone: one channel could not
    teardown(conn)


def test_with_redis_gone_the_teardown_after_a_failed_ack_does_not_raise(
    server: RedisServer,
) -> None:
    redis_down_teardown(server, hand_back=True)


def test_without_the_hand_back_the_same_teardown_raises(server: RedisServer) -> None:
    """The failure the hand-back exists for, on this kombu: if this stops raising, kombu fixed
    it, and `workers.consumer` can go."""
    with pytest.raises(AttributeError, match="hostname"):
        redis_down_teardown(server, hand_back=False)


@pytest.mark.parametrize("broadcast_first", [False, True], ids=["tasks-first", "broadcast-first"])
def test_with_redis_answering_the_message_goes_back_to_its_queue_at_once(
    server: RedisServer, client: redis.Redis, broadcast_first: bool
) -> None:
    """Whichever channel comes first: one that holds nothing is passed over, not the end."""
    conn, _ = deliver(server, in_flight=False, broadcast_first=broadcast_first)
    assert client.llen(QUEUE) == 0
    assert hand_back_unacked(conn) == 0
    assert client.llen(QUEUE) == 1
    assert client.hlen("unacked") == 0
    teardown(conn)
    assert client.llen(QUEUE) == 1  # handed back once, not twice


@pytest.mark.parametrize("app", [make_celery(), side_app("side", "side")], ids=["train", "side"])
def test_every_worker_runs_the_consumer_that_hands_back(app: Any) -> None:
    assert symbol_by_name(app.conf.worker_consumer) is PdppoConsumer


def test_the_worker_consumer_hands_back_before_celery_tears_the_connection_down(
    server: RedisServer, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hook itself, with Celery's teardown stood in for by a probe of the queue: the
    message is back in it when the teardown starts."""
    conn, _ = deliver(server, in_flight=False)
    at_teardown: list[int] = []
    monkeypatch.setattr(
        CeleryConsumer,
        "on_connection_error_after_connected",
        lambda self, exc: at_teardown.append(client.llen(QUEUE)),
    )
    consumer = PdppoConsumer.__new__(PdppoConsumer)  # the hook reads nothing else of it
    consumer.connection = conn
    consumer.on_connection_error_after_connected(ConnectionError("lost"))
    assert at_teardown == [1]
    teardown(conn)
