"""The store tests' own redis-server and client fixtures (`tests.store.conftest`), `held` (a
running job whose lease this worker holds) and `sent`."""

import pytest

from tests.store.conftest import client, server
from tests.workers.held import held

__all__ = ["client", "held", "sent", "server"]


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
