"""A redis-server of the test's own (stopped, stalled or restarted by the test), and clients."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from pdppo.store import StoreConfig, store_client
from tests.integration.stack import RedisServer


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    srv = RedisServer(tmp_path / "first")
    yield srv
    srv.stop()


@pytest.fixture
def client(server: RedisServer) -> Iterator[redis.Redis]:
    """A store client that gives up on one reply after 0.3 s: a stall of a second or two is many
    failed attempts."""
    conn = store_client(server.url(), StoreConfig(socket_timeout=0.3, connect_timeout=0.3))
    yield conn
    conn.close()
