"""The outbox's take (`pdppo.store.jobs.outbox._TAKE_DUE`) at the edge of due: an entry whose check
is due exactly now is taken, held and returned with its queue, as `ZRANGEBYSCORE` up to now
(inclusive) found it; a later one is left as it was; one whose job a worker claimed between the
read and the take (its entry gone) is neither taken nor put back."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from pdppo.store import OUTBOX, JobStore, Outbox
from tests.support.seed import seed_job
from tests.support.stack import RedisServer


@pytest.fixture
def r(server: RedisServer) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(server.url(), decode_responses=True)
    yield conn
    conn.close()


# the entry's check time, with now = 30 -> what take_due returns, the entry's score after
CASES = [
    (29.0, [("j1", "gpu")], 35.0),
    (30.0, [("j1", "gpu")], 35.0),  # due exactly now
    (30.5, [], 30.5),
]


@pytest.mark.parametrize(("score", "taken", "after"), CASES)
def test_an_entry_due_exactly_now_is_taken(
    r: redis.Redis, score: float, taken: list[tuple[str, str]], after: float
) -> None:
    seed_job(r, "j1", "queued", queue="gpu")
    r.zadd(OUTBOX, {"j1": score})
    assert Outbox(r).take_due(5.0, now=30.0) == taken
    assert r.zscore(OUTBOX, "j1") == after


def test_an_entry_claimed_between_the_read_and_the_take_is_left_out(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    for job_id, score in (("j1", 10.0), ("j2", 20.0)):
        seed_job(r, job_id, "queued", queue="gpu")
        r.zadd(OUTBOX, {job_id: score})
    outbox = Outbox(r)
    read = r.zrangebyscore

    def read_then_claimed(*args: Any, **kwargs: Any) -> Any:
        due = read(*args, **kwargs)
        assert JobStore(r).claim("j1", "w1")  # its claim takes its entry out
        return due

    monkeypatch.setattr(r, "zrangebyscore", read_then_claimed)
    assert outbox.take_due(5.0, now=30.0) == [("j2", "gpu")]
    assert r.zrange(OUTBOX, 0, -1, withscores=True) == [("j2", 35.0)]
