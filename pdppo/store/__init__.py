"""The Redis store shared by the API (asyncio) and the workers (threads), one module per resource,
grouped by concern.

- `keys`: key names, job ids, timestamps, digests (and the data layout they name);
- `retry`: deliberate timeouts and bounded retries through a Redis stall;
- `jobs/`: a job. `transitions`: every change of its state, a Lua script each with the typed call
  that runs it; `records`: `JobRecord` (the job hash, decoded) and `CreateResult`; `api_side`:
  `AsyncJobStore`, what the API does to jobs (create, get, list, cancel, fail); `worker_side`:
  `JobStore`, what workers do to a job they run (claim, publish, finish, requeue); `steering`:
  change, pause, resume; `outbox`: `Outbox`, the queued jobs whose task no worker has claimed
  yet (the enqueue outbox); `events`: a job's event stream and metrics rows (`AsyncEventStore`,
  `EventStore`);
- `webhooks/`: `endpoints` (what the API registers and reads), `feed` (every job's changes, written
  by the job scripts), `deliveries` (what the webhook workers route, take and record);
- `files`: uploaded files' records (`AsyncFileStore`, `FileStore`; the bytes: `pdppo.files`);
- `experiments`, `metadata` (the OpenAI jobs' metadata index), `stats` (service counters);
- `deletion`: deleting an ended job or an unused file, and expiring old jobs' artifacts
  (`AsyncDeletion`, `Retention`; the folders: `pdppo.disk_usage`).

Every state change that must not race is one Lua script (a job's: `jobs.transitions`; a file's,
a webhook's...: next to the method that runs it), so the record, the indexes and the event stream
never disagree, whoever crashes when. Each process makes
one client; the job store it builds owns it and hands it to the per-resource stores (`.events`),
whose methods stay reachable from the job store too. New resources (uploaded files, an enqueue
outbox) go in modules of their own here (in the package of their concern), built the same way
over the same client.
"""

from pdppo.store.files import AsyncFileStore, FileRecord, FileStore
from pdppo.store.jobs.api_side import AsyncJobStore
from pdppo.store.jobs.events import AsyncEventStore, EventStore
from pdppo.store.jobs.outbox import Outbox
from pdppo.store.jobs.records import TERMINAL, CreateResult, JobRecord
from pdppo.store.jobs.worker_side import JobStore
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
