"""Fixtures that start the real service: redis-server, `pdppo serve` and `pdppo worker`.

Session-scoped and shared by every integration test (and the client tests): one Redis server, one
service (API + one CPU worker) on database 0. Tests that kill workers get their own service on
another database through `make_service`, so they never disturb the shared one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aredis

from pdppo.store.jobs.api_side import AsyncJobStore
from tests.support.stack import STORE_DB, RedisServer, Run, Service


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


@pytest.fixture
def alice(service: Service) -> Iterator[httpx.Client]:
    with service.client("alice") as client:
        yield client


@pytest.fixture
def bob(service: Service) -> Iterator[httpx.Client]:
    with service.client("bob") as client:
        yield client


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)
