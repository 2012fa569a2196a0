"""The Redis store shared by the API (asyncio) and the workers (threads), one module per resource.

- `keys`: key names, job ids, timestamps, digests (and the data layout they name);
- `records`: `JobRecord` (the job hash, decoded) and `CreateResult`;
- `jobs_api`: `AsyncJobStore`, what the API does to jobs (create, get, list, cancel, fail);
- `jobs_worker`: `JobStore`, what workers do to a job they run (claim, publish, finish, requeue);
- `outbox`: `Outbox`, the queued jobs whose task no worker has claimed yet (the enqueue outbox);
- `events`: a job's event stream and metrics rows (`AsyncEventStore`, `EventStore`);
- `files`: uploaded files' records (`AsyncFileStore`, `FileStore`; the bytes: `pdppo.files`).
- `deletion`: deleting an ended job or an unused file, and expiring old jobs' artifacts
  (`AsyncDeletion`, `Retention`; the folders: `pdppo.disk_usage`).

Every state change that must not race is one Lua script next to the method that runs it, so the
record, the indexes and the event stream never disagree, whoever crashes when. Each process makes
one client; the job store it builds owns it and hands it to the per-resource stores (`.events`),
whose methods stay reachable from the job store too. New resources (uploaded files, an enqueue
outbox) go in modules of their own here, built the same way over the same client.
"""

from pdppo.store.events import AsyncEventStore, EventStore
from pdppo.store.files import AsyncFileStore, FileRecord, FileStore
from pdppo.store.jobs_api import AsyncJobStore
from pdppo.store.jobs_worker import JobStore
from pdppo.store.keys import (
    OUTBOX,
    PREFIX,
    RUNNING_SET,
    events_key,
    idempotency_key,
    job_key,
    lease_key,
    metrics_key,
    new_job_id,
    now_iso,
    spec_digest,
    tenant_active_key,
    tenant_jobs_key,
)
from pdppo.store.outbox import Outbox
from pdppo.store.records import TERMINAL, CreateResult, JobRecord
from pdppo.store.retry import StoreConfig, StoreRetry, StoreUnavailable, is_transient, store_client

__all__ = [
    "OUTBOX",
    "PREFIX",
    "RUNNING_SET",
    "TERMINAL",
    "AsyncEventStore",
    "AsyncFileStore",
    "AsyncJobStore",
    "CreateResult",
    "EventStore",
    "FileRecord",
    "FileStore",
    "JobRecord",
    "JobStore",
    "Outbox",
    "StoreConfig",
    "StoreRetry",
    "StoreUnavailable",
    "events_key",
    "idempotency_key",
    "is_transient",
    "job_key",
    "lease_key",
    "metrics_key",
    "new_job_id",
    "now_iso",
    "spec_digest",
    "store_client",
    "tenant_active_key",
    "tenant_jobs_key",
]
