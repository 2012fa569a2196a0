"""The sample queue's Celery app and names, apart from the task (`workers.sampling`), so that the
API publishes a completion request without importing torch or the model code.

Why its own app and queue (`sample`): training workers consume `cpu`/`gpu` one job at a time for
hours, and a completion queued behind a job would wait for it; a sample worker consumes only this
queue, so a completion never waits on training, and no generation runs in the API process.

The answer goes back through Redis, not a Celery result backend: the worker pushes it onto
`reply_key(request id)` and the API blocks on that key (BLPOP) for what is left of the request's
timeout. One round trip, no result backend to configure or expire, and a reply nobody waits for
any more expires on its own (REPLY_TTL_SECONDS)."""

from __future__ import annotations

from typing import Any

from workers.celery_app import side_app

QUEUE = "sample"
COMPLETE_TASK = "pdppo.sample.complete"
REPLY_TTL_SECONDS = 120
ACTIVE_TTL_SECONDS = 900  # a tenant's in-flight counter outlives no crashed API process longer


def reply_key(request_id: str) -> str:
    return f"pdppo:sample:reply:{request_id}"


def active_key(tenant: str) -> str:
    """The tenant's completion requests in flight (PDPPO_SAMPLE_MAX_CONCURRENT_PER_TENANT)."""
    return f"pdppo:sample:active:{tenant}"


sample_app = side_app("pdppo-sample", QUEUE)


def publish(request: dict[str, Any]) -> None:
    """Blocking (kombu): call it from a thread."""
    sample_app.send_task(COMPLETE_TASK, args=[request], queue=QUEUE, task_id=str(request["id"]))
