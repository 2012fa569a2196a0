"""Fixtures that start the real service: redis-server, `pdppo serve` and `pdppo worker`.

Session-scoped and shared by every integration test (and the client tests): one Redis server, one
service (API + one CPU worker) on database 0. Tests that kill workers get their own service on
another database through `make_service`, so they never disturb the shared one.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aredis
from httpx_sse import connect_sse

from pdppo.store.jobs.api_side import AsyncJobStore
from tests.integration.stack import REDIS_DATABASES, RedisServer, Service

TERMINAL = {"succeeded", "failed", "cancelled"}
STORE_DB = 15  # services use 0 and the low numbers


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's alone: one it may stall, stop or restart."""
    server = RedisServer(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def store_redis(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of database STORE_DB, empty before and after the test: for the store's own
    scripts, with no service on it."""
    conn = redis.Redis.from_url(redis_server.url(STORE_DB), decode_responses=True)
    conn.flushdb()
    yield conn
    conn.flushdb()
    conn.close()


# runs `work(store)` on an AsyncJobStore of database STORE_DB, in an event loop and a connection
# of its own, and returns what it returns
Run = Callable[[Callable[[AsyncJobStore], Awaitable[Any]]], Any]


@pytest.fixture
def run_store(redis_server: RedisServer) -> Run:
    def runner(work: Callable[[AsyncJobStore], Awaitable[Any]]) -> Any:
        async def main() -> Any:
            conn = aredis.Redis.from_url(redis_server.url(STORE_DB), decode_responses=True)
            try:
                return await work(AsyncJobStore(conn))
            finally:
                await conn.aclose()

        return asyncio.run(main())

    return runner


@pytest.fixture(scope="session")
def service(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    """API and one CPU worker on Redis db 0 (alice, bob and carol have keys: stack.KEYS)."""
    svc = Service(redis_server, tmp_path_factory.mktemp("service"), db=0)
    try:
        svc.start_api()
        svc.start_worker("cpu")
        yield svc
    finally:
        svc.stop()


def extra_service(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory, **env: str
) -> Service:
    """A service (not started) on a fresh Redis database (1, 2, ...): the next one after those
    of the folders `extra*` this session made, one per service.

    Never a database already used in this session: a service on the session `service`'s
    database 0 (or on an earlier test's) shares its Celery queues, so that service's worker takes
    the new service's tasks. (With 16 databases and `% 16`, the 16th extra service of a full run
    landed on database 0: the job a test killed a worker under ran on the session worker.)"""
    db = 1 + len(list(tmp_path_factory.getbasetemp().glob("extra*")))
    assert db < REDIS_DATABASES, f"more than {REDIS_DATABASES - 1} extra services in a run"
    return Service(redis_server, tmp_path_factory.mktemp("extra"), db=db, env=env)


@pytest.fixture
def make_service(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., Service]]:
    """Builds extra services (`extra_service`); stopped after the test."""
    made: list[Service] = []

    def make(**env: str) -> Service:
        svc = extra_service(redis_server, tmp_path_factory, **env)
        made.append(svc)
        return svc

    yield make
    for svc in made:
        svc.stop()


@pytest.fixture
def alice(service: Service) -> Iterator[httpx.Client]:
    with service.client("alice") as client:
        yield client


@pytest.fixture
def bob(service: Service) -> Iterator[httpx.Client]:
    with service.client("bob") as client:
        yield client


def wait_path(
    client: httpx.Client,
    path: str,
    predicate: Callable[[dict[str, Any]], bool],
    timeout: float = 60,
    interval: float = 0.05,
) -> dict[str, Any]:
    """GET `path` until its JSON satisfies `predicate`; the last answer is in the timeout's
    message, so a test that gives up says what it saw."""
    deadline = time.monotonic() + timeout
    while True:
        got: dict[str, Any] = client.get(path).json()
        if predicate(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting on {path}: {got}")
        time.sleep(interval)


def wait_for(
    client: httpx.Client,
    job_id: str,
    predicate: Callable[[dict[str, Any]], bool],
    timeout: float = 60,
) -> dict[str, Any]:
    return wait_path(client, f"/v1/jobs/{job_id}", predicate, timeout)


def wait_status(
    client: httpx.Client, job_id: str, statuses: set[str] | str, timeout: float = 60
) -> dict[str, Any]:
    wanted = {statuses} if isinstance(statuses, str) else statuses
    return wait_for(client, job_id, lambda job: job["status"] in wanted, timeout)


def handled(log: str, job_id: str) -> bool:
    """The worker got the task and is done with it (ran the skip, or discarded it as revoked)."""
    return f"job {job_id}: " in log or f"revoked task: pdppo.train[{job_id}]" in log


def read_events(
    client: httpx.Client,
    job_id: str,
    *,
    last_event_id: str | None = None,
    limit: int | None = None,
    timeout: float = 120,
) -> list[dict[str, Any]]:
    """Events as {id, event, data} until `done` (the server closes) or `limit` events."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    out: list[dict[str, Any]] = []
    with connect_sse(
        client, "GET", f"/v1/jobs/{job_id}/events", headers=headers, timeout=timeout
    ) as source:
        assert source.response.status_code == 200, source.response.read()
        for sse in source.iter_sse():
            if not sse.event or sse.event == "message":
                continue  # comments (pings) are not events
            out.append({"id": sse.id, "event": sse.event, "data": json.loads(sse.data)})
            if limit is not None and len(out) >= limit:
                break
    return out


def metric_steps(events: list[dict[str, Any]]) -> list[int]:
    return [e["data"]["step"] for e in events if e["event"] == "metrics"]


def every_step_once(client: httpx.Client, job_id: str, steps: int) -> list[dict[str, Any]]:
    """Asserts that the job's metrics rows and its event stream each hold steps 1..`steps` once,
    in order (what a resumed or interrupted job owes); returns the events for further checks."""
    history = client.get(f"/v1/jobs/{job_id}/metrics").json()["items"]
    assert [row["step"] for row in history] == list(range(1, steps + 1))
    events = read_events(client, job_id)
    assert metric_steps(events) == list(range(1, steps + 1))
    return events


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)
