"""Redis key names, job ids, timestamps and digests: the one place that knows how things are named.

Per job: a hash (the job record: status, timestamps, tenant, spec, progress, latest metrics,
error), a stream of events (what SSE serves; entry ids are the SSE ids), a list of metrics rows
(what `/metrics` serves) and a lease key. Per tenant: a sorted set of job ids for listing and a
set of active (queued or running) ids for the quota. Global: the set of running ids (what the
reaper scans) and the outbox, a sorted set of queued ids whose task no worker has claimed yet,
scored by when a dispatcher should next check that the task exists (`pdppo.store.outbox`).
Every store module builds its keys here, so a new resource (uploaded files) adds its key
functions next to these and cannot collide with them.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from datetime import UTC, datetime

PREFIX = "pdppo"
RUNNING_SET = f"{PREFIX}:running"
OUTBOX = f"{PREFIX}:outbox"


def job_key(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}"


def events_key(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:events"


def metrics_key(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:metrics"


def lease_key(job_id: str) -> str:
    return f"{PREFIX}:job:{job_id}:lease"


def tenant_jobs_key(tenant: str) -> str:
    return f"{PREFIX}:tenant:{tenant}:jobs"


def tenant_active_key(tenant: str) -> str:
    return f"{PREFIX}:tenant:{tenant}:active"


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
