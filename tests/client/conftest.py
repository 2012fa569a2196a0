"""Client and CLI tests run against the real stack (redis-server, `pdppo serve`, one `pdppo
worker`) of tests/conftest.py's fixtures, overridden here: this folder has its own session
instance, so client jobs never queue behind the service tests' jobs.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest

from pdppo.client import Client
from tests.client.jobs import TENANT, FinishedJob
from tests.support.specs import smoke_spec
from tests.support.stack import KEYS, RedisServer, Service, running_redis, running_service


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    yield from running_redis(tmp_path_factory.mktemp("redis"))


@pytest.fixture(scope="session")
def service(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    yield from running_service(redis_server, tmp_path_factory.mktemp("service"))


@pytest.fixture
def client(service: Service) -> Iterator[Client]:
    with Client(service.base_url, KEYS[TENANT], reconnect_delay=0.1) as c:
        yield c


@pytest.fixture(scope="session")
def finished_job(service: Service) -> FinishedJob:
    with Client(service.base_url, KEYS[TENANT]) as c:
        job = c.submit(smoke_spec(steps=4, checkpoint_every=2) | {"name": "finished"})
        events = list(c.follow(job.id))
    return FinishedJob(job.id, events)


@pytest.fixture
def cli_env(service: Service) -> dict[str, str]:
    return {"PDPPO_URL": service.base_url, "PDPPO_API_KEY": KEYS[TENANT]}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "service" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """An xfail test's failure goes to its tmp_path/failure.txt: pytest shows only the reason,
    but keeps its last three runs' tmp_path folders, so a failure that happens only in a
    full-suite run can be read there next to the children's logs."""
    report = yield
    tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
    if call.excinfo is not None and hasattr(report, "wasxfail") and tmp_path is not None:
        (tmp_path / "failure.txt").write_text(str(call.excinfo.getrepr(style="long")))
    return report
