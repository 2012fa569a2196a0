"""An asyncio client of a test's redis-server, for the store's async scripts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aredis

from tests.support.stack import RedisServer


def run(server: RedisServer, work: Callable[[aredis.Redis], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        conn = aredis.Redis.from_url(server.url(), decode_responses=True)
        try:
            return await work(conn)
        finally:
            await conn.aclose()

    return asyncio.run(main())
