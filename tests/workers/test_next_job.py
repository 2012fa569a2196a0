"""Which job a training task starts (`workers.tasks.next_job`), against a real redis-server: the
one the fair order puts first on the task's queue, and when that is not the task's own job, the
task is given back to its queue while its job still waits (the dispatcher looks for each job's
task by its id). Celery's `send_task` and kombu's restore are stood in for; the run on the real
stack is tests/integration/test_fair_scheduling.py's."""

from __future__ import annotations

import json

import pytest
import redis
from kombu.transport.redis import Channel as RedisChannel

from tests.support.seed import seed_job
from workers import tasks

BOBS = ("00000000000100000000000b", "00000000000200000000000b")
ALICES = "00000000000300000000000a"


@pytest.fixture
def sent(client: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, int]]:
    made: list[tuple[str, str, int]] = []
    monkeypatch.setattr(tasks, "redis_client", lambda: client)
    monkeypatch.setattr(tasks, "enqueue", lambda *task: made.append(task))
    return made


def bob_then_alice(client: redis.Redis, **alice: str) -> None:
    """Two of bob's jobs queued, then one of alice's; bob has been served, alice never."""
    for job_id in BOBS:
        seed_job(client, job_id, "queued", tenant="bob")
    seed_job(client, ALICES, "queued", tenant="alice", **alice)
    client.zadd("pdppo:fair:cpu:tenants", {"bob": 1})  # as a claim of his leaves it


def test_the_tasks_own_job_when_it_is_next(
    client: redis.Redis, sent: list[tuple[str, str, int]]
) -> None:
    bob_then_alice(client)
    assert tasks.next_job(ALICES) == ALICES
    assert sent == []


@pytest.mark.parametrize(("experiment", "priority"), [(None, 0), ("exp-1", 9)])
def test_another_job_when_it_is_next_and_the_tasks_own_is_sent_again(
    client: redis.Redis,
    sent: list[tuple[str, str, int]],
    experiment: str | None,
    priority: int,
) -> None:
    """Bob's task, alice's turn: alice's job starts, and bob's waits with a task of its own:
    no take of his task is recorded here, so a new one is sent (an experiment's child's at the
    children's priority)."""
    bob_then_alice(client)
    if experiment:
        client.hset(f"pdppo:job:{BOBS[1]}", "experiment", experiment)
    assert tasks.next_job(BOBS[1]) == ALICES
    assert sent == [(BOBS[1], "cpu", priority)]


def test_a_task_whose_job_left_the_queue_starts_the_next_one_and_sends_nothing(
    client: redis.Redis, sent: list[tuple[str, str, int]]
) -> None:
    """A task sent twice (the outbox's, a worker's), whose job another task started: it is a turn
    like any other."""
    bob_then_alice(client)
    client.hset(f"pdppo:job:{BOBS[0]}", "status", "running")
    assert tasks.next_job(BOBS[0]) == ALICES
    assert sent == []


def test_the_tasks_own_job_when_the_order_has_none(
    client: redis.Redis, sent: list[tuple[str, str, int]]
) -> None:
    """A job queued before the fair order existed, not in it yet (the outbox's adoption adds it
    when a worker starts), and a job gone: the task's own, as before."""
    seed_job(client, ALICES, "queued", tenant="alice")
    client.delete("pdppo:fair:cpu:tenants")
    assert tasks.next_job(ALICES) == ALICES
    assert tasks.next_job("ffffffffffffffffffffffff") == "ffffffffffffffffffffffff"
    assert sent == []


def test_the_tasks_own_job_when_its_flow_is_next_whatever_its_place_in_it(
    client: redis.Redis, sent: list[tuple[str, str, int]]
) -> None:
    """Bob's turn, and the task is his second job's: that one starts (his flow gets its turn
    either way) and no task is sent again; a flow's tasks, in whatever order they come, never
    add a delivery (tests/integration/test_outbox.py counts them)."""
    bob_then_alice(client)
    client.zadd("pdppo:fair:cpu:tenants", {"bob": 1, "alice": 2})
    assert tasks.next_job(BOBS[1]) == BOBS[1]
    assert tasks.next_job(ALICES) == BOBS[0]  # alice's task in bob's turn: his first job
    assert sent == [(ALICES, "cpu", 0)]


def test_a_task_whose_turn_went_to_another_job_is_given_back_to_the_head_of_its_queue(
    client: redis.Redis, sent: list[tuple[str, str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker took bob's task (kombu's record of it: `unacked`), and it is alice's turn: the
    message goes back where it was (kombu's restore, by its delivery tag), not a new one at the
    back, so bob's jobs keep their order; the latest take of it when taken twice."""
    restored: list[str] = []
    monkeypatch.setattr(tasks, "restore_taken", restored.append)
    bob_then_alice(client)
    message = {"body": "", "headers": {"id": BOBS[0], "task": "pdppo.train"}, "properties": {}}
    for tag, at in (("tag-old", 100.0), ("tag-7", 200.0)):
        client.hset(RedisChannel.unacked_key, tag, json.dumps([message, "", "cpu"]))
        client.zadd(RedisChannel.unacked_index_key, {tag: at})
    assert tasks.next_job(BOBS[0]) == ALICES
    assert (restored, sent) == (["tag-7"], [])
