"""`held` (a running job whose lease this worker holds, on the `client` of tests/conftest.py)
and `sent`."""

from __future__ import annotations

import pytest
import redis

from pdppo.store import job_key
from tests.support.seed import running_job
from tests.workers.held import Held
from workers.job.lease import Lease


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """The (job id, queue) of each task the reaper or dispatcher sends, in order: Celery's
    `send_task` stood in for (the end-to-end path is tests/integration/test_outbox.py's)."""
    tasks: list[tuple[str, str]] = []
    monkeypatch.setattr(
        "workers.upkeep.reaper.enqueue",
        lambda job_id, queue, priority=0: tasks.append((job_id, queue)),
    )
    return tasks


@pytest.fixture
def held(client: redis.Redis) -> Held:
    job = running_job(client, "j1")
    client.hset(job_key("j1"), "step", 2)
    lease = Lease(client, "j1", seconds=30, owner="w1")
    assert lease.acquire()
    return Held(client, job, lease)
