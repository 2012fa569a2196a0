"""The store's state machine against a real redis-server: every row of `tests/store/transitions.py`
(a job seeded in a state, one request through the store's own methods, what it answers and
leaves), so that a changed rule in any Lua script that moves a job's state fails a row."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, cast

import pytest
import redis
import redis.asyncio as aredis

from pdppo.store import JobRecord, JobStore
from pdppo.store.deletion import PURGE_SET, AsyncDeletion
from pdppo.store.jobs.api_side import AsyncJobStore
from pdppo.store.jobs.fair import PLAIN_FLOW
from pdppo.store.jobs.steering import AsyncSteering
from pdppo.store.jobs.worker_side import FencedOut
from pdppo.store.keys import (
    OUTBOX,
    RUNNING_SET,
    STATS,
    WEBHOOK_FEED,
    events_key,
    fair_jobs_key,
    job_key,
    lease_key,
    tenant_active_key,
    tenant_jobs_key,
)
from tests.store.transitions import JOB, QUEUE, ROWS, STATES, TENANT, TOKEN, TRACKED, Row
from tests.support.seed import seed_job
from tests.support.stack import RedisServer


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the whole table: a row is a few milliseconds of scripts."""
    server = RedisServer(tmp_path_factory.mktemp("transitions"))
    yield server
    server.stop()


@pytest.fixture
def r(shared: RedisServer) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(shared.url(), decode_responses=True)
    conn.flushdb()
    yield conn
    conn.close()


def seed(client: redis.Redis, state: str) -> None:
    status, fields, leased = STATES[state]
    if status:
        token = TOKEN if leased else None
        seed_job(client, JOB, status, tenant=TENANT, queue=QUEUE, lease_token=token, **fields)


def describe(client: redis.Redis) -> str:
    raw = cast(dict[str, str], client.hgetall(job_key(JOB)))
    if not raw:
        return "missing"
    text = raw["status"]
    if raw["status"] == "failed" and raw.get("error_code"):
        text += f":{raw['error_code']}"
    if raw.get("artifacts_expired_at"):
        text += "+expired"
    if raw.get("cancel_requested") == "1":
        text += "+cancel"
    if raw.get("pause_requested") == "1":
        text += "+pause"
    if raw.get("pause_stopping") == "1":
        text += "+stopping"
    return text


def indexes(client: redis.Redis) -> str:
    found = [
        ("listed", client.zscore(tenant_jobs_key(TENANT), JOB) is not None),
        ("active", bool(client.sismember(tenant_active_key(TENANT), JOB))),
        ("running", bool(client.sismember(RUNNING_SET, JOB))),
        ("outbox", client.zscore(OUTBOX, JOB) is not None),
        ("fair", client.zscore(fair_jobs_key(QUEUE, TENANT, PLAIN_FLOW), JOB) is not None),
        ("lease", bool(client.exists(lease_key(JOB)))),
        ("purge", client.zscore(PURGE_SET, JOB) is not None),
    ]
    return " ".join(name for name, there in found if there)


def counters(client: redis.Redis) -> dict[str, str | None]:
    values = cast(list[str | None], client.hmget(job_key(JOB), list(TRACKED)))
    return {
        **dict(zip(TRACKED, values, strict=True)),
        **cast(dict[str, str | None], client.hgetall(STATS)),
    }


def record(client: redis.Redis) -> JobRecord:
    """The job as a caller holds it (a missing one: as it was before it went)."""
    found = JobStore(client).get(JOB)
    if found is not None:
        return found
    fields = {"id": JOB, "tenant": TENANT, "status": "succeeded", "spec": "{}"}
    return JobRecord.from_hash({**fields, "queue": QUEUE, "created_at": "2026-01-01T00:00:00Z"})


def on_api(url: str, work: Callable[[aredis.Redis], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        conn = aredis.Redis.from_url(url, decode_responses=True)
        try:
            return await work(conn)
        finally:
            await conn.aclose()

    return asyncio.run(main())


def publish(client: redis.Redis, kind: str = "metrics") -> object:
    """Step 1's `kind` by the holder of the lease (TOKEN); `fenced` when it no longer holds it."""
    store = JobStore(client)
    send: dict[str, Callable[[], bool]] = {
        "metrics": lambda: store.publish_step(JOB, 1, 10, {"loss": 0.5}, lease_token=TOKEN),
        "eval": lambda: store.publish_eval(JOB, 1, 10, {"reward": 0.5}, lease_token=TOKEN),
        "samples": lambda: store.publish_samples(JOB, 1, [{"c": "a"}], lease_token=TOKEN),
        "phase": lambda: store.publish_phase(
            JOB, "training", 1, 10, at="2026-01-01T00:00:00.000Z", lease_token=TOKEN
        ),
        "checkpoint": lambda: store.publish_checkpoint(JOB, 1, "step-000001", lease_token=TOKEN),
    }
    try:
        return send[kind]()
    except FencedOut:
        return "fenced"


def requeue(client: redis.Redis, *, token: str = "", limit: int = 0, expire: bool) -> str:
    if expire:  # its worker died: nobody renewed the lease
        client.delete(lease_key(JOB))
    store = JobStore(client)
    return store.requeue_if_orphaned(record(client), lease_token=token, max_worker_losses=limit)


def begin_pause(client: redis.Redis) -> object:
    try:
        return JobStore(client).begin_pause(JOB, lease_token=TOKEN)
    except FencedOut:
        return "fenced"


def finish(client: redis.Redis, status: str) -> bool:
    extra = {"error_code": "training_error", "error_message": "m"} if status == "failed" else {}
    return JobStore(client).finish(record(client), status, extra)


async def delete(conn: aredis.Redis, tenant: str) -> str:
    done = await AsyncDeletion(conn).delete_job(JOB, tenant)
    return f"{done.outcome}:{done.status}" if done.status else done.outcome


async def create(conn: aredis.Redis, max_active: int) -> str:
    done = await AsyncJobStore(conn).create(
        tenant=TENANT, queue=QUEUE, name=None, spec_json="{}", total_steps=10,
        max_active=max_active, idempotency=None, idempotency_ttl=0, job_id=JOB,
    )  # fmt: skip
    return done.outcome


async def pause(conn: aredis.Redis) -> str:
    return (await AsyncSteering(conn).pause(JOB)).outcome


def patch_if_match(url: str, *, base: int, expected: list[int]) -> tuple[str, str]:
    """A change computed from version `base`, sent with `If-Match` naming `expected`."""
    return cast(
        tuple[str, str],
        on_api(
            url,
            lambda a: AsyncSteering(a).patch(
                JOB, base, {"lr": 0.1}, 20, "lr 0.1", expected_versions=expected
            ),
        ),
    )


REQUESTS: dict[str, Callable[[redis.Redis, str], object]] = {
    "create": lambda c, url: on_api(url, lambda a: create(a, 2)),
    "create:full": lambda c, url: on_api(url, lambda a: create(a, 0)),
    "claim": lambda c, url: JobStore(c).claim(JOB, "w2"),
    "publish": lambda c, url: publish(c),
    "publish:eval": lambda c, url: publish(c, "eval"),
    "publish:samples": lambda c, url: publish(c, "samples"),
    "publish:phase": lambda c, url: publish(c, "phase"),
    "publish:checkpoint": lambda c, url: publish(c, "checkpoint"),
    "finish:succeeded": lambda c, url: finish(c, "succeeded"),
    "finish:failed": lambda c, url: finish(c, "failed"),
    "finish:cancelled": lambda c, url: finish(c, "cancelled"),
    "requeue": lambda c, url: requeue(c, expire=True),
    "requeue:limit1": lambda c, url: requeue(c, limit=1, expire=True),
    "requeue:leased": lambda c, url: requeue(c, expire=False),
    "hand-back": lambda c, url: requeue(c, token=TOKEN, limit=1, expire=False),
    "begin-pause": lambda c, url: begin_pause(c),
    "cancel": lambda c, url: on_api(url, lambda a: AsyncJobStore(a).cancel(JOB)),
    "pause": lambda c, url: on_api(url, pause),
    "resume": lambda c, url: on_api(
        url, lambda a: AsyncSteering(a).resume(JOB, tenant=TENANT, max_active=2)
    ),
    "resume:full": lambda c, url: on_api(
        url, lambda a: AsyncSteering(a).resume(JOB, tenant=TENANT, max_active=0)
    ),
    "patch": lambda c, url: on_api(
        url, lambda a: AsyncSteering(a).patch(JOB, 0, {"lr": 0.1}, 20, "lr 0.1")
    ),
    "patch:stale": lambda c, url: on_api(
        url, lambda a: AsyncSteering(a).patch(JOB, 3, {"lr": 0.1}, 20, "lr 0.1")
    ),
    "patch:if-match": lambda c, url: patch_if_match(url, base=0, expected=[0]),
    "patch:if-match-stale": lambda c, url: patch_if_match(url, base=3, expected=[3]),
    "patch:if-match-list": lambda c, url: patch_if_match(url, base=0, expected=[2, 0]),
    "patch:if-match-moved": lambda c, url: patch_if_match(url, base=3, expected=[0]),
    "delete": lambda c, url: on_api(url, lambda a: delete(a, TENANT)),
    "delete:other-tenant": lambda c, url: on_api(url, lambda a: delete(a, "u")),
}


def test_the_table_names_known_states_and_requests_and_no_row_twice() -> None:
    assert {row.state for row in ROWS} == set(STATES)
    assert {row.request for row in ROWS} == set(REQUESTS)
    keys = [(row.state, row.request) for row in ROWS]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize("row", ROWS, ids=lambda row: f"{row.state}-{row.request}")
def test_transition(row: Row, r: redis.Redis, shared: RedisServer) -> None:
    seed(r, row.state)
    state, where, counted = describe(r), indexes(r), counters(r)
    returns = REQUESTS[row.request](r, shared.url())
    after = counters(r)
    changed = sorted(k for k in {*counted, *after} if counted.get(k) != after.get(k))
    if not r.exists(job_key(JOB)):  # deleted: its fields are gone, not changed
        changed = [k for k in changed if k not in TRACKED]
    events = [fields["type"] for _, fields in r.xrange(events_key(JOB))]
    observed = (returns, describe(r), " ".join(events), " ".join(changed), indexes(r))
    expected = (
        row.returns,
        state if row.after == "=" else row.after,
        row.events,
        row.changes,
        where if row.indexes == "=" else row.indexes,
    )
    assert observed == expected
    # every status change and checkpoint it made is in the webhook feed too, the same, and
    # nothing else is
    fed = [(f["type"], f["data"], f["job"], f["tenant"]) for _, f in r.xrange(WEBHOOK_FEED)]
    entries = r.xrange(events_key(JOB))
    fed_types = ("status", "checkpoint")
    made = [(f["type"], f["data"], JOB, TENANT) for _, f in entries if f["type"] in fed_types]
    assert fed == made


def test_the_table_covers_each_request_in_every_state_it_can_meet() -> None:
    """Claim, cancel, pause, resume, finish, requeue and patch each meet every live state
    (queued, each running with its flags, paused) and an ended and a missing job."""
    live = {"queued", "running", "running+cancel+pause", "paused"}
    for request in ("claim", "cancel", "pause", "resume", "patch", "finish:succeeded"):
        met = {row.state for row in ROWS if row.request == request}
        assert live | {"succeeded", "missing"} <= met, request
    requeue = {row.state for row in ROWS if row.request == "requeue"}
    assert set(STATES) - {"succeeded+lease", "failed:storage_full+expired"} <= requeue


PAUSES = [row for row in ROWS if row.request == "pause"]


@pytest.mark.parametrize("row", PAUSES, ids=lambda row: row.state)
def test_a_pause_returns_the_job_as_it_left_it(
    row: Row, r: redis.Redis, shared: RedisServer
) -> None:
    """The API answers with this record (`POST /v1/jobs/{id}/pause`), not one read after the
    script, which a worker carrying the pause out may have changed meanwhile."""
    seed(r, row.state)
    done = on_api(shared.url(), lambda a: AsyncSteering(a).pause(JOB))
    assert done.outcome == row.returns
    assert done.record == JobStore(r).get(JOB)
    assert (done.record is None) == (row.state == "missing")
