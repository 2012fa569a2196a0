"""`held`: a running job whose lease this worker holds, for the tests of how the worker records
a job's end (tests/workers/test_runner.py) and watches it run (tests/workers/test_supervise.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import redis

from pdppo.settings import Settings
from pdppo.store import JobRecord, JobStore, StoreRetry, job_key
from tests.support.seed import stream
from workers.job import runner
from workers.job.lease import Lease
from workers.job.runner import _Outcome, _Watch

SETTINGS = Settings(job_timeout_minutes=1.5, store_outage_seconds=45)
RETRY = StoreRetry(2.0)


@dataclass
class Held:
    """A running job whose lease this worker holds, at step 2."""

    client: redis.Redis
    job: JobRecord
    lease: Lease
    store: JobStore = field(init=False)

    def __post_init__(self) -> None:
        self.store = JobStore(self.client)

    def conclude(
        self,
        result: dict[str, Any] | None = None,
        reason: str | None = None,
        *,
        killed: bool = False,
        exitcode: int | None = 0,
        oom: bool = False,
    ) -> _Outcome:
        watch = _Watch()
        watch.result, watch.reason, watch.killed = result, reason, killed
        return runner._conclude(
            self.store,
            RETRY,
            self.job,
            lease=self.lease,
            watch=watch,
            exitcode=exitcode,
            oom_killed=oom,
            settings=SETTINGS,
        )

    def field(self, name: str) -> str | None:
        return cast(str | None, self.client.hget(job_key(self.job.id), name))

    def logs(self) -> list[str]:
        return [data["message"] for kind, data in stream(self.client, self.job.id) if kind == "log"]
