"""tests/deploy/test_client_install.py drives a service of its own (a session instance of this
folder, over tests/conftest.py's): the installs it checks never wait behind other tests' jobs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.stack import RedisServer, Service, running_redis, running_service


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    yield from running_redis(tmp_path_factory.mktemp("redis"))


@pytest.fixture(scope="session")
def service(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    yield from running_service(redis_server, tmp_path_factory.mktemp("service"))
