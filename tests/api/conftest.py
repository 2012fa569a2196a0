"""The in-process app's fixtures (tests/support/inprocess.py): `redis_url`, a redis-server of the
test module's own, and `settings`, the app's settings on its database 3, emptied for each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from pdppo.settings import Settings
from tests.support.inprocess import KEYS, MAX_FILE
from tests.support.stack import RedisServer


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server.url(3)
    server.stop()


@pytest.fixture
def settings(redis_url: str, tmp_path: Path) -> Settings:
    redis.Redis.from_url(redis_url).flushdb()
    return Settings(  # type: ignore[call-arg]
        redis_url=redis_url,
        api_keys=",".join(f"{t}:{k}" for t, k in KEYS.items()),
        artifact_dir=tmp_path,
        max_file_bytes=MAX_FILE,
        min_free_bytes=0,
        _env_file=None,
    )
