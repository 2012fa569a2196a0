"""The once-only rule of what a job process publishes (`pdppo.store.jobs.worker_side`): a step's
metrics, its evaluation, its samples and a checkpoint each remember the last step published of
their kind and refuse a step at or before it, the same step included (a resumed run redoes the
steps after its checkpoint, the one it stopped on too); samples keep their newest `SAMPLES_KEPT`
rows only. Against a real redis-server, through the store's own methods."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
import redis

from pdppo.store import JobStore
from pdppo.store.jobs import worker_side as jobs_worker
from pdppo.store.keys import eval_key, events_key, metrics_key, samples_key
from tests.support.seed import seed_job
from tests.support.stack import RedisServer

JOB = "0000000000aa000000000002"
TOKEN = "w1:0123456789abcdef"

Send = Callable[[JobStore, int], bool]
# kind -> (how a job process publishes step n of it, the list of its rows, or None)
KINDS: dict[str, tuple[Send, str | None]] = {
    "metrics": (
        lambda s, n: s.publish_step(JOB, n, 10, {"loss": n / 10}, lease_token=TOKEN),
        metrics_key(JOB),
    ),
    "eval": (
        lambda s, n: s.publish_eval(JOB, n, 10, {"reward": n / 10}, lease_token=TOKEN),
        eval_key(JOB),
    ),
    "samples": (
        lambda s, n: s.publish_samples(JOB, n, [{"c": f"s{n}"}], lease_token=TOKEN),
        samples_key(JOB),
    ),
    "checkpoint": (
        lambda s, n: s.publish_checkpoint(JOB, n, f"step-{n}", lease_token=TOKEN),
        None,
    ),
}


@pytest.fixture
def r(server: RedisServer) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(server.url(), decode_responses=True)
    yield conn
    conn.close()


def steps_of(r: redis.Redis, key: str) -> list[int]:
    return [json.loads(row)["step"] for row in r.lrange(key, 0, -1)]


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_step_at_or_before_the_last_one_of_its_kind_is_refused(r: redis.Redis, kind: str) -> None:
    send, rows = KINDS[kind]
    seed_job(r, JOB, "running", lease_token=TOKEN)
    store = JobStore(r)
    assert [send(store, n) for n in (3, 3, 2, 4)] == [True, False, False, True]
    events = [(f["type"], json.loads(f["data"])["step"]) for _, f in r.xrange(events_key(JOB))]
    assert events == [(kind, 3), (kind, 4)]
    if rows is not None:
        assert steps_of(r, rows) == [3, 4]


@pytest.mark.parametrize(("kept", "left"), [(1, [3]), (2, [2, 3])])
def test_samples_keep_their_newest_rows(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch, kept: int, left: list[int]
) -> None:
    """The bound at its smallest, 1, and above it; an evaluation keeps every row (its list is
    the curve `/eval` serves: `keep` 0)."""
    monkeypatch.setattr(jobs_worker, "SAMPLES_KEPT", kept)
    seed_job(r, JOB, "running", lease_token=TOKEN)
    store = JobStore(r)
    for n in (1, 2, 3):
        assert KINDS["samples"][0](store, n)
        assert KINDS["eval"][0](store, n)
    assert steps_of(r, samples_key(JOB)) == left
    assert steps_of(r, eval_key(JOB)) == [1, 2, 3]
