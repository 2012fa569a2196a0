"""A job's event stream and metrics rows: what SSE and `/metrics` read, and what workers log.

The entries that change a job's state (status, metrics, checkpoint, done) are added by the job
scripts in `jobs_api` and `jobs_worker`, atomically with the record; their payloads come from
`_status_data`/`_log_data` here so that every writer formats them alike. Everything that only
reads the stream or the metrics rows, or appends a plain log line, is here, one store per side
(`AsyncEventStore` for the API, `EventStore` for the workers) over the job store's client; reads
over many jobs at once belong here too.
"""

from __future__ import annotations

import json
from typing import Any, cast

import redis
import redis.asyncio as aredis

from pdppo.store.keys import events_key, metrics_key, now_iso


def _status_data(status: str) -> str:
    return json.dumps({"status": status, "at": now_iso()})


def _log_data(message: str) -> str:
    return json.dumps({"message": message, "at": now_iso()})


class AsyncEventStore:
    """What the API reads of a job's events and metrics, over `redis.asyncio`."""

    def __init__(self, client: aredis.Redis) -> None:
        self.redis = client

    async def metrics_history(self, job_id: str) -> list[dict[str, Any]]:
        rows = cast(list[str], await self.redis.lrange(metrics_key(job_id), 0, -1))
        return [json.loads(row) for row in rows]

    async def events_after(
        self, job_id: str, after: str, count: int = 1000
    ) -> list[tuple[str, dict[str, str]]]:
        """Stream entries strictly after `after` ("0" for all), oldest first."""
        start = f"({after}" if after not in ("0", "0-0") else "-"
        entries = await self.redis.xrange(events_key(job_id), start, "+", count=count)
        return cast(list[tuple[str, dict[str, str]]], entries)

    async def last_event_id(self, job_id: str) -> str:
        entries = await self.redis.xrevrange(events_key(job_id), "+", "-", count=1)
        return cast(str, entries[0][0]) if entries else "0-0"


class EventStore:
    """What the workers add to a job's event stream outside the job scripts (log lines)."""

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client

    def publish_log(self, job_id: str, message: str) -> None:
        self.redis.xadd(events_key(job_id), {"type": "log", "data": _log_data(message)})
