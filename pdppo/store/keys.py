"""Redis key names, job ids, timestamps and digests: the one place that knows how things are named.

Per job: a hash (the job record: status, timestamps, tenant, spec, progress, latest metrics,
error), a stream of events (what SSE serves; entry ids are the SSE ids), a list of metrics rows
(what `/metrics` serves), lists of evaluation and samples rows (`/eval`, `/samples`) and a lease
key. Per tenant: a sorted set of job ids for listing and a
set of active (queued or running) ids for the quota. Global: the set of running ids (what the
reaper scans) and the outbox, a sorted set of queued ids whose task no worker has claimed yet,
scored by when a dispatcher should next check that the task exists (`pdppo.store.jobs.outbox`).
Uploaded files (`pdppo.store.files`), per tenant: a hash per file, a sorted set of them for
listing, a byte count for the quota, and a short lock per file id for writers; and its bytes on
disk as last measured. Deleted jobs whose folder may still be on disk wait in the purge set.
Webhooks (`pdppo.store.webhooks.endpoints`): per tenant, a hash per endpoint, a sorted set of them
and a delivery log per endpoint; globally the feed of job events to route, the deliveries by id and
the due set of deliveries by when to attempt each.
Jobs made through OpenAI's API are also indexed per tenant by each `metadata` pair. Queued jobs
are also in the fair order (`pdppo.store.jobs.fair`), per queue, tenant and flow.
Experiments (`pdppo.store.experiments`), per tenant: a hash per experiment, a hash of its child
job ids by (arm, seed), and a sorted set of them for listing; never shared between tenants.
Every store module builds its keys here, so resources cannot collide.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from datetime import UTC, datetime

PREFIX = "pdppo"
RUNNING_SET = f"{PREFIX}:running"
OUTBOX = f"{PREFIX}:outbox"
STATS = f"{PREFIX}:stats"  # the service's counters, `pdppo.store.stats`
WORKERS = f"{PREFIX}:workers"  # worker name -> when it last reached Redis, `pdppo.store.stats`
PURGE_SET = f"{PREFIX}:purge"  # deleted jobs whose folder may be on disk still (store.deletion)
WEBHOOK_FEED = f"{PREFIX}:webhooks:feed"  # every job's status changes, for webhooks (store.feed)
WEBHOOK_DUE = f"{PREFIX}:webhooks:due"  # delivery id -> when to attempt it (store.webhooks)
FAIR_PREFIX = f"{PREFIX}:fair:"  # the queued jobs' fair order, per queue (store.jobs.fair)
FAIR_TURN = f"{FAIR_PREFIX}turn"  # its counter of turns
FAIR_ARRIVALS = f"{FAIR_PREFIX}arrivals"  # ... and of tenants and experiments come to it
# Redis's own time at the last lease renewal or reaper pass, and a key that lives for a while
# after a gap in them: Redis did not answer, so expired leases may have live holders
# (`pdppo.store.jobs.worker_side`, the requeue script)
STORE_CLOCK = f"{PREFIX}:clock"
STALL_SEEN = f"{PREFIX}:clock:stall"


def host_jobs_key(host: str) -> str:
    """The jobs running on the cores of one host (`workers.job.cores`): job id -> when its entry
    lapses unless renewed."""
    return f"{PREFIX}:host:{host}:jobs"


def job_key(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}"


def events_key(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:events"


def metrics_key(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:metrics"


def eval_key(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:eval"


def samples_key(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:samples"


def lease_key(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:lease"


def fair_tenants_key(queue: str) -> str:
    """The tenants with jobs queued on `queue`, by their last turn (`pdppo.store.jobs.fair`, whose
    scripts build the same names)."""
    return f"{FAIR_PREFIX}{queue}:tenants"


def fair_flows_key(queue: str, tenant: str) -> str:
    """The tenant's flows (plain jobs, each experiment) with jobs queued on `queue`."""
    return f"{FAIR_PREFIX}{queue}:tenant:{tenant}"


def fair_jobs_key(queue: str, tenant: str, flow: str) -> str:
    """The flow's jobs queued on `queue`, by id."""
    return f"{fair_flows_key(queue, tenant)}:flow:{flow}"


def tenant_jobs_key(tenant: str) -> str:
    return f"{PREFIX}:tenant:{tenant}:jobs"


def tenant_metadata_key(tenant: str, key: str, value: str) -> str:
    """The tenant's jobs whose OpenAI `metadata` has `key` = `value` (`pdppo.store.metadata`),
    a sorted set of ids like `tenant_jobs_key`. Both are the client's: hashed, so any text
    makes a key of fixed length, and the tenant is in it, so two tenants never share one."""
    digest = hashlib.sha256(json.dumps([key, value]).encode()).hexdigest()[:32]
    return f"{PREFIX}:tenant:{tenant}:metadata:{digest}"


def tenant_metadata_ready_key(tenant: str) -> str:
    """Set once the tenant's jobs made before the metadata index are in it."""
    return f"{PREFIX}:tenant:{tenant}:metadata-ready"


def tenant_active_key(tenant: str) -> str:
    return f"{PREFIX}:tenant:{tenant}:active"


def tenant_file_key(tenant: str, file_id: str) -> str:
    """An uploaded file's record. File ids derive from the content, so two tenants uploading the
    same bytes get the same id: records (and files on disk) are per tenant, never shared."""
    return f"{PREFIX}:tenant:{tenant}:file:{file_id}"


def tenant_file_lock_key(tenant: str, file_id: str) -> str:
    return f"{PREFIX}:tenant:{tenant}:file:{file_id}:lock"


def tenant_files_key(tenant: str) -> str:
    return f"{PREFIX}:tenant:{tenant}:files"


def tenant_file_bytes_key(tenant: str) -> str:
    return f"{PREFIX}:tenant:{tenant}:file_bytes"


def tenant_usage_key(tenant: str) -> str:
    """The tenant's bytes on disk as last measured (`api.routes.storage`), kept a short while."""
    return f"{PREFIX}:tenant:{tenant}:usage"


def tenant_webhooks_key(tenant: str) -> str:
    return f"{PREFIX}:tenant:{tenant}:webhooks"


def tenant_webhook_key(tenant: str, webhook_id: str) -> str:
    return f"{PREFIX}:tenant:{tenant}:webhook:{webhook_id}"


def tenant_webhook_log_key(tenant: str, webhook_id: str) -> str:
    """The endpoint's deliveries, newest last (scored by when each was made)."""
    return f"{PREFIX}:tenant:{tenant}:webhook:{webhook_id}:deliveries"


def tenant_experiment_key(tenant: str, experiment_id: str) -> str:
    return f"{PREFIX}:tenant:{tenant}:experiment:{experiment_id}"


def tenant_experiment_runs_key(tenant: str, experiment_id: str) -> str:
    """The experiment's child jobs: field `<arm index>/<seed>` -> job id."""
    return f"{PREFIX}:tenant:{tenant}:experiment:{experiment_id}:runs"


def tenant_experiments_key(tenant: str) -> str:
    return f"{PREFIX}:tenant:{tenant}:experiments"


def experiment_idempotency_key(tenant: str, key: str) -> str:
    """Apart from the jobs' keys: the same Idempotency-Key may name a job and an experiment."""
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f"{PREFIX}:idem:{tenant}:experiment:{digest}"


def child_idempotency(experiment_id: str, arm_index: int, seed: int) -> str:
    """The Idempotency-Key an experiment's child job is created under: a retry of a creation
    that died half way finds the children already made instead of making them twice."""
    return f"experiment:{experiment_id}:{arm_index}:{seed}"


def webhook_delivery_key(delivery_id: str) -> str:
    return f"{PREFIX}:webhooks:delivery:{delivery_id}"


def idempotency_key(tenant: str, key: str) -> str:
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f"{PREFIX}:idem:{tenant}:{digest}"


def new_job_id() -> str:
    """Time-ordered ids (ms timestamp, then randomness) so that listing by id is newest first."""
    return f"{int(time.time() * 1000):012x}{secrets.token_hex(6)}"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def spec_digest(spec_json: str) -> str:
    return hashlib.sha256(spec_json.encode()).hexdigest()
