"""Client and CLI tests run against the real stack of `tests/integration` (redis-server,
`pdppo serve`, one `pdppo worker`), through the same fixtures: imported here, they give this
folder its own session instance, so client jobs never queue behind the service tests' jobs.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pdppo.client import Client, Event, spec_yaml_dump
from tests.integration.conftest import redis_server, service  # noqa: F401
from tests.integration.stack import KEYS, Service, smoke_spec

TENANT = "carol"


@dataclass(frozen=True)
class FinishedJob:
    """A job that ran to success, with its whole event stream as read once, uninterrupted."""

    id: str
    events: list[Event]


def parked_spec(name: str = "parked") -> dict[str, Any]:
    """No GPU worker runs in the tests: a gpu job stays queued until cancelled."""
    spec = smoke_spec()
    spec["name"] = name
    spec["resources"] = {"device": "gpu"}
    return spec


def write_spec(path: Path, spec: dict[str, Any]) -> Path:
    path.write_text(spec_yaml_dump(spec))  # read back as written (`spec_yaml_load`)
    return path


@pytest.fixture
def client(service: Service) -> Iterator[Client]:  # noqa: F811
    with Client(service.base_url, KEYS[TENANT], reconnect_delay=0.1) as c:
        yield c


@pytest.fixture(scope="session")
def finished_job(service: Service) -> FinishedJob:  # noqa: F811
    with Client(service.base_url, KEYS[TENANT]) as c:
        job = c.submit(smoke_spec(steps=4, checkpoint_every=2) | {"name": "finished"})
        events = list(c.follow(job.id))
    return FinishedJob(job.id, events)


@pytest.fixture
def cli_env(service: Service) -> dict[str, str]:  # noqa: F811
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
