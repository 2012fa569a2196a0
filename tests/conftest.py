"""Suite-wide pytest settings.

`-n auto` (README's test command, pytest-xdist) runs the suite in this many worker processes:
two per CPU, since most tests spend their time waiting on processes of their own (redis-server,
the API, Celery workers, training subprocesses), and at most one per 3 GiB of memory, each worker
starting its own Redis and service. PYTEST_XDIST_AUTO_NUM_WORKERS overrides it, `-n N` too, and
`-n 0` runs in this process.

The fixtures here are the real things more than one folder's tests use: `redis_server` and
`service` (a redis-server, and the API with one CPU worker on its database 0, once a session),
`make_service` (a service of the test's own, on a fresh database), `server` and `client` (a
redis-server of the test's own and a store client of it) and `mlflow_server`. A folder whose
tests must not share the session's service (tests/client, tests/browser, tests/deploy)
overrides `redis_server` and `service` in its own conftest.py. Helpers are in tests/support."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from pdppo.store import StoreConfig, store_client
from tests.support.mlflow import MlflowServer, mlflow_server_command, start_mlflow
from tests.support.stack import RedisServer, Service, extra_service, running_redis, running_service

GIB_PER_WORKER = 3
WORKERS_PER_CPU = 2


def _memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return float(GIB_PER_WORKER)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    cpus = len(os.sched_getaffinity(0))
    return max(1, min(WORKERS_PER_CPU * cpus, int(_memory_gib() // GIB_PER_WORKER)))


def pytest_configure(config: pytest.Config) -> None:
    """On a pytest-xdist worker: torch's threads (and those of the processes tests start) are
    the worker's share of the CPUs, one at least. Torch takes every CPU by default, so N workers
    on this many CPUs would run N times too many threads, which spin waiting for each other."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers or not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    threads = str(max(1, len(os.sched_getaffinity(0)) // int(workers)))
    os.environ.setdefault("OMP_NUM_THREADS", threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that need an MLflow server are deselected where none can run (tests/support/mlflow.py
    says where one comes from), not skipped."""
    needs = [
        item
        for item in items
        if "mlflow_server" in getattr(item, "fixturenames", ())
        or item.get_closest_marker("mlflow_server") is not None
    ]
    if needs and mlflow_server_command() is None:
        config.hook.pytest_deselected(items=needs)
        items[:] = [item for item in items if item not in needs]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    server = start_mlflow(tmp_path_factory.mktemp("mlflow"))
    yield server
    server.stop()


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


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    yield from running_redis(tmp_path_factory.mktemp("redis"))


@pytest.fixture(scope="session")
def service(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    """API and one CPU worker on Redis db 0 (alice, bob and carol have keys: stack.KEYS)."""
    yield from running_service(redis_server, tmp_path_factory.mktemp("service"))


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
