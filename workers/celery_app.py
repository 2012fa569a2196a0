"""The Celery app: a Redis broker, queues `cpu` and `gpu`, one task at a time per worker process.

Imported by the API to enqueue (by task name, so the API never imports torch or the trainer) and
by `pdppo worker`. Delivery is at-least-once (`acks_late`): a task whose worker died is delivered
again, and the job lease (`workers.job.lease`) keeps a redelivered copy from running a job twice.

The outbox dispatcher (`workers.upkeep.reaper.dispatch_once`) must know whether a queued job still
has a live task, and Celery has no API for that, so `broker_view` reads kombu's Redis layout
directly: each queue is a list named after it (plus one per non-zero priority step) that producers
`LPUSH` to and consumers `BRPOP` from, and a message a consumer took but has not acknowledged sits
in the `unacked` hash (delivery tag -> message) with its take time in `unacked_index`. kombu
restores those only after `visibility_timeout`; `restore_taken` does the same for one message,
earlier.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from celery import Celery
from kombu import Queue
from kombu.transport.redis import PRIORITY_STEPS
from kombu.transport.redis import Channel as RedisChannel

from pdppo.settings import Settings, get_settings

TRAIN_TASK = "pdppo.train"
QUEUES = ("cpu", "gpu")
# Celery's consumer, with a failed ack's message handed back before a lost connection is torn
# down (the module's docstring says why); named, not imported, so that the API never loads it
CONSUMER = "workers.consumer:Consumer"


def broker_timeouts(settings: Settings) -> dict[str, float]:
    """kombu's Redis transport waits for a reply forever by default: a worker told to stop while
    Redis is stalled (SIGSTOP, a hung host, a half-open connection) sat in its shutdown's first
    broker call (closing the control channel) for as long as the stall lasted. The store's
    timeouts (`pdppo.store.retry.StoreConfig`) bound every broker call too: a stall shorter than
    them rides through, a longer one is a lost connection, which the consumer reconnects from
    and a shutdown passes over."""
    return {
        "socket_timeout": settings.redis_socket_timeout_seconds,
        "socket_connect_timeout": settings.redis_connect_timeout_seconds,
    }


def make_celery() -> Celery:
    settings = get_settings()
    app = Celery("pdppo", broker=settings.redis_url, include=["workers.tasks"])
    app.conf.update(
        task_queues=[Queue(name) for name in QUEUES],
        task_default_queue="cpu",
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        result_backend=None,
        # Ack after the task returns, and redeliver if the worker process is lost.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # A worker holds exactly the job it runs, never a second one waiting behind it.
        worker_prefetch_multiplier=1,
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout_seconds,
            **broker_timeouts(settings),
        },
        broker_connection_retry_on_startup=True,
        # A Redis blip must not cancel the running job: the runner rides out outages (its lease,
        # `pdppo.store.retry`). False is Celery 5's default, which Celery 6 flips to True; said
        # here so that an upgrade keeps it. (Celery 5.7 still logs its pending-deprecation
        # warning at every reconnect while the setting is False:
        # `Consumer.on_connection_error_after_connected`.)
        worker_cancel_long_running_tasks_on_connection_loss=False,
        worker_consumer=CONSUMER,
        worker_send_task_events=False,
        task_send_sent_event=False,
    )
    return app


celery_app = make_celery()


def side_app(name: str, queue: str) -> Celery:
    """A Celery app of one queue beside the training one (webhooks, completions): its own, so
    that its workers never import the trainer's task module nor start the training workers'
    fork server, reaper and retention (`workers.tasks`' worker_ready hooks)."""
    settings = get_settings()
    app = Celery(name, broker=settings.redis_url)
    app.conf.update(
        task_queues=[Queue(queue)],
        task_default_queue=queue,
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        result_backend=None,
        worker_prefetch_multiplier=1,
        broker_transport_options=broker_timeouts(settings),
        broker_connection_retry_on_startup=True,
        worker_consumer=CONSUMER,
        worker_send_task_events=False,
        task_send_sent_event=False,
    )
    return app


# kombu's Redis transport keeps a list per priority step of a queue and a consumer takes from the
# step-0 list first, then 3, 6, 9 (`_brpop_start`): 0 is the most urgent.
JOB_PRIORITY = 0
EXPERIMENT_PRIORITY = 9


def task_priority(experiment: str | None) -> int:
    """An experiment's children's tasks go behind plain jobs' in the broker. Which job a task
    starts is the fair order's to say (`pdppo.store.jobs.fair`: tenants, then a tenant's plain
    jobs and each experiment, take turns); the broker's order decides only for a job the order
    lacks (queued by a version before it, until a worker's start adds it)."""
    return EXPERIMENT_PRIORITY if experiment else JOB_PRIORITY


def enqueue(job_id: str, queue: str, priority: int = JOB_PRIORITY) -> None:
    """Send the training task for `job_id`; the Celery task id is the job id (revoke by job)."""
    celery_app.send_task(TRAIN_TASK, args=[job_id], queue=queue, task_id=job_id, priority=priority)


def revoke_queued(*job_ids: str) -> None:
    """Best effort: workers drop the queued tasks (one broadcast for all); the task also skips a
    cancelled job itself."""
    celery_app.control.revoke(list(job_ids))


@dataclass(frozen=True)
class Taken:
    """A message a consumer took and has not acknowledged (kombu's `unacked`)."""

    tag: str  # its delivery tag
    at: float  # when it was taken (Unix seconds, the consumer's clock)


@dataclass(frozen=True)
class BrokerView:
    """Where the tasks of some queues are, by task id (the job id, see `enqueue`)."""

    waiting: frozenset[str]  # in a queue's list, not taken yet
    taken: dict[str, list[Taken]] = field(default_factory=dict)

    def latest(self, task_id: str) -> Taken | None:
        """The last time `task_id` was taken, of the takes not acknowledged yet."""
        return max(self.taken.get(task_id, []), key=lambda taken: taken.at, default=None)


def _option(name: str, default: str) -> str:
    options = celery_app.conf.broker_transport_options or {}
    return str(options.get(name, default))


def _queue_keys(queue: str) -> list[str]:
    """The lists kombu keeps for `queue`: one per priority step (`Channel._q_for_pri`)."""
    sep = RedisChannel.sep
    return [queue if step == 0 else f"{queue}{sep}{step}" for step in PRIORITY_STEPS]


def _task_id(raw: str) -> str | None:
    """The task id of one kombu message (Celery's protocol 2 puts it in the headers)."""
    try:
        message = json.loads(raw)
        if isinstance(message, list):  # an `unacked` entry: [message, exchange, routing key]
            message = message[0]
        found = message.get("headers", {}).get("id") or message.get("properties", {}).get(
            "correlation_id"
        )
    except (ValueError, AttributeError, IndexError, TypeError):
        return None
    return str(found) if found else None


def broker_view(client: redis.Redis, queues: Iterable[str]) -> BrokerView:
    """Which tasks are waiting in `queues` and which are taken, read in one transaction (so a
    message moving between the two is not missed by both; a consumer's `BRPOP` and its `unacked`
    write are two commands, though, so a task can still be seen nowhere for a moment, and the
    caller must tolerate sending it twice). Reads whole queues: call it once per batch."""
    prefix = _option("global_keyprefix", "")
    lists = [prefix + key for queue in sorted(set(queues)) for key in _queue_keys(queue)]
    pipe = client.pipeline(transaction=True)
    for key in lists:
        pipe.lrange(key, 0, -1)
    pipe.hgetall(prefix + _option("unacked_key", RedisChannel.unacked_key))
    pipe.zrange(
        prefix + _option("unacked_index_key", RedisChannel.unacked_index_key),
        0,
        -1,
        withscores=True,
    )
    replies: list[Any] = pipe.execute()
    waiting = {task for raw in replies[:-2] for item in raw if (task := _task_id(item))}
    unacked = cast(dict[str, str], replies[-2])
    taken_at = dict(cast(list[tuple[str, float]], replies[-1]))
    taken: dict[str, list[Taken]] = {}
    for tag, raw in unacked.items():
        task = _task_id(raw)
        if task is not None:
            taken.setdefault(task, []).append(Taken(tag, taken_at.get(tag, 0.0)))
    return BrokerView(frozenset(waiting), taken)


def restore_taken(tag: str) -> None:
    """Put a taken, unacknowledged message back at the head of its queue, as kombu itself does
    after `visibility_timeout` (its own `restore_by_tag`: one transaction, nothing if the message
    was acknowledged meanwhile). For a task whose consumer died before it claimed the job."""
    with celery_app.connection_for_write() as conn:
        conn.default_channel.qos.restore_by_tag(tag, leftmost=False)
