"""The service's state in `/metrics`: jobs, queues, workers, leases, the outbox, grading.

Read from Redis at scrape time, not kept in this process: the jobs' state lives in Redis, and
what workers and job processes count reaches it too (`pdppo.store.stats` says why one hash in
Redis rather than a metrics port per worker). A scrape costs two pipelined round trips: the
counters, the outbox, the running set, the worker beats and the configured tenants' active
sets, then one HMGET per active job (queued, running or paused: bounded by the tenants' quotas,
and by `MAX_JOBS_READ` whatever happens).

A stalled Redis must not hang a scrape, or Prometheus would time out on the API's own metrics
too: the read gets `READ_SECONDS`, after which the scrape answers with the API's metrics and
`pdppo_service_state_up 0` (no stale service values: absent series are honest, old ones lie).

Label sets are bounded: queues are the names `pdppo.queues` makes (anything else is `other`),
statuses and failure codes come from fixed lists (an unknown code is `other`), workers are the
nodes that beat within `WORKER_FORGET_SECONDS` (their names come from the workers, never from a
client).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import cast

import redis.asyncio as aredis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pdppo.queues import QUEUE_PATTERN
from pdppo.settings import Settings
from pdppo.store import OUTBOX, RUNNING_SET, AsyncJobStore, job_key, tenant_active_key
from pdppo.store.stats import SEP, STATS, WORKERS

log = logging.getLogger(__name__)

READ_SECONDS = 1.0
"""Longest wait for Redis in one scrape (Prometheus' default scrape timeout is 10 s)."""
MAX_JOBS_READ = 20_000
"""Active jobs read per scrape at most; past it the counts are of the first ones."""
WORKER_ALIVE_SECONDS = 30.0
"""A worker that beat this recently counts as alive: it beats every 5 s after reaching Redis
(`workers.upkeep.heartbeat.WRITE_EVERY_SECONDS`), so this allows a few missed beats."""
ACTIVE_STATUSES = ("queued", "running", "paused")
ENDED_STATUSES = ("succeeded", "failed", "cancelled")
FAILURE_CODES = (
    "timeout",
    "out_of_memory",
    "killed",
    "crashed",
    "over_budget",
    "invalid_input",
    "training_error",
    "worker_lost",
    "store_error",
    "storage_full",
    "storage_error",
)
"""The failure codes (docs/operators/limits-and-failures.md); `none` for a job that did not fail."""
LEASE_LOSS_REASONS = ("unreachable", "taken")
RECONCILER_ACTIONS = ("requeued", "failed", "cancelled", "paused", "task_sent", "task_restored")
GRADING = ("completions", "errors", "timeouts")
BASE_QUEUES = ("cpu", "gpu")  # always present, so that an idle queue reads 0, not no data
_QUEUE = re.compile(QUEUE_PATTERN)


def queue_label(queue: str | None) -> str:
    return queue if queue and _QUEUE.match(queue) else "other"


def code_label(code: str) -> str:
    if not code:
        return "none"
    return code if code in FAILURE_CODES else "other"


@dataclass
class ServiceState:
    """What one scrape read, already reduced to label values."""

    jobs: Counter[tuple[str, str]] = field(default_factory=Counter)  # (queue, status)
    oldest_queued: dict[str, float] = field(default_factory=dict)  # queue: age in seconds
    running_by_worker: Counter[str] = field(default_factory=Counter)
    worker_ages: dict[str, float] = field(default_factory=dict)
    outbox_depth: int = 0
    outbox_overdue: float = 0.0  # seconds the most overdue outbox check is late
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def queues(self) -> list[str]:
        seen = {q for q, _ in self.jobs} | set(self.oldest_queued)
        seen |= {name.split(SEP)[1] for name in self.counters if name.startswith("ended" + SEP)}
        return sorted(set(BASE_QUEUES) | {queue_label(q) for q in seen})


def _age(iso: str | None, now: float) -> float:
    if not iso:
        return 0.0
    try:
        return max(0.0, now - datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return 0.0


async def read_state(
    client: aredis.Redis, tenants: Iterable[str], now: float | None = None
) -> ServiceState:
    """Two pipelined round trips; raises RedisError (the caller bounds the time)."""
    now = time.time() if now is None else now
    tenants = sorted(set(tenants))
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(STATS)
    pipe.zrange(OUTBOX, 0, MAX_JOBS_READ - 1, withscores=True)
    pipe.zcard(OUTBOX)
    pipe.smembers(RUNNING_SET)
    pipe.zrange(WORKERS, 0, -1, withscores=True)
    for tenant in tenants:
        pipe.smembers(tenant_active_key(tenant))
    stats, outbox, depth, running, beats, *active = await pipe.execute()
    state = ServiceState(outbox_depth=int(depth))
    state.counters = {name: int(value) for name, value in cast(dict[str, str], stats).items()}
    outbox = cast(list[tuple[str, float]], outbox)
    if outbox:
        state.outbox_overdue = max(0.0, now - min(score for _, score in outbox))
    for node, at in cast(list[tuple[str, float]], beats):
        state.worker_ages[node] = max(0.0, now - at)
    ids = {job_id for job_id, _ in outbox} | cast(set[str], running)
    for members in active:
        ids |= cast(set[str], members)
    ids_read = sorted(ids)[:MAX_JOBS_READ]
    pipe = client.pipeline(transaction=False)
    for job_id in ids_read:
        pipe.hmget(job_key(job_id), ["status", "queue", "queued_at", "updated_at", "worker"])
    rows = cast(list[list[str | None]], await pipe.execute()) if ids_read else []
    for status, queue, queued_at, updated_at, worker in rows:
        if status not in ACTIVE_STATUSES:
            continue  # ended or gone since an index listed it
        q = queue_label(queue or "cpu")
        state.jobs[(q, status)] += 1
        if status == "queued":
            # queued_at: when it was queued (created, requeued or resumed), which a PATCH of
            # a queued job does not move (its `updated_at` it does); a job queued before the
            # field existed has only `updated_at`
            age = _age(queued_at or updated_at, now)
            state.oldest_queued[q] = max(state.oldest_queued.get(q, 0.0), age)
        elif status == "running" and worker:
            state.running_by_worker[worker] += 1
    return state


class _Snapshot(Collector):
    """Turns one `ServiceState` (None: the read failed) into metric families."""

    def __init__(self, state: ServiceState | None, elapsed: float) -> None:
        self.state = state
        self.elapsed = elapsed

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "pdppo_service_state_up",
            "1 when this scrape read the service's state from Redis in time, else 0",
        )
        up.add_metric([], 0 if self.state is None else 1)
        yield up
        took = GaugeMetricFamily(
            "pdppo_service_state_read_seconds", "Time this scrape spent reading Redis"
        )
        took.add_metric([], self.elapsed)
        yield took
        if self.state is not None:
            yield from _families(self.state)


def _families(s: ServiceState) -> Iterator[Metric]:
    queues = s.queues
    jobs = GaugeMetricFamily(
        "pdppo_jobs", "Jobs now queued, running or paused", labels=["queue", "status"]
    )
    for q in queues:
        for status in ACTIVE_STATUSES:
            jobs.add_metric([q, status], s.jobs[(q, status)])
    yield jobs
    depth = GaugeMetricFamily(
        "pdppo_queue_depth", "Jobs waiting for a worker (queued)", labels=["queue"]
    )
    oldest = GaugeMetricFamily(
        "pdppo_queue_oldest_job_age_seconds",
        "How long the longest-waiting queued job has waited (0: none waits)",
        labels=["queue"],
    )
    for q in queues:
        depth.add_metric([q], s.jobs[(q, "queued")])
        oldest.add_metric([q], s.oldest_queued.get(q, 0.0))
    yield depth
    yield oldest
    alive = GaugeMetricFamily(
        "pdppo_workers_alive", f"Workers that reached Redis in the last {WORKER_ALIVE_SECONDS:g}s"
    )
    alive.add_metric([], sum(age <= WORKER_ALIVE_SECONDS for age in s.worker_ages.values()))
    yield alive
    beat = GaugeMetricFamily(
        "pdppo_worker_last_beat_age_seconds",
        "Seconds since each worker last reached Redis (workers silent for an hour are dropped)",
        labels=["worker"],
    )
    running = GaugeMetricFamily(
        "pdppo_worker_running_jobs", "Jobs each worker runs now", labels=["worker"]
    )
    for node in sorted(set(s.worker_ages) | set(s.running_by_worker)):
        if node in s.worker_ages:
            beat.add_metric([node], s.worker_ages[node])
        running.add_metric([node], s.running_by_worker[node])
    yield beat
    yield running
    outbox = GaugeMetricFamily(
        "pdppo_outbox_depth", "Queued jobs whose task no worker has claimed yet (the outbox)"
    )
    outbox.add_metric([], s.outbox_depth)
    yield outbox
    overdue = GaugeMetricFamily(
        "pdppo_outbox_overdue_seconds",
        "How late the most overdue outbox check is (grows when no dispatcher runs)",
    )
    overdue.add_metric([], s.outbox_overdue)
    yield overdue
    yield from _counters(s, queues)


def _counters(s: ServiceState, queues: list[str]) -> Iterator[Metric]:
    ended = CounterMetricFamily(
        "pdppo_jobs_ended", "Jobs that ended, by outcome", labels=["queue", "status", "code"]
    )
    ended_counts: Counter[tuple[str, str, str]] = Counter()
    for q in queues:  # known outcomes at 0, so that increase() sees their first one
        ended_counts[(q, "succeeded", "none")] += 0
        ended_counts[(q, "cancelled", "none")] += 0
        for code in FAILURE_CODES:
            ended_counts[(q, "failed", code)] += 0
    for name, n in s.counters.items():
        parts = name.split(SEP)
        if parts[0] == "ended" and len(parts) == 4 and parts[2] in ENDED_STATUSES:
            ended_counts[(queue_label(parts[1]), parts[2], code_label(parts[3]))] += n
    for labels, n in sorted(ended_counts.items()):
        ended.add_metric(list(labels), n)
    yield ended
    yield _counter(
        s,
        "pdppo_lease_renewals",
        "Job leases renewed by workers",
        [],
        [((), "lease_renewals")],
    )
    yield _counter(
        s,
        "pdppo_lease_losses",
        "Job leases a worker lost (unreachable: Redis did not answer; taken: another holder)",
        ["reason"],
        [((r,), f"lease_losses{SEP}{r}") for r in LEASE_LOSS_REASONS],
    )
    yield _counter(
        s,
        "pdppo_reconciler_actions",
        "What reapers and dispatchers did: orphaned jobs requeued, failed, cancelled or paused; "
        "tasks sent again or put back in their queue",
        ["action"],
        [((a,), f"reconciler{SEP}{a}") for a in RECONCILER_ACTIONS],
    )
    for what in GRADING:
        yield _counter(
            s,
            f"pdppo_grading_{what}",
            "Completions graded (all jobs)"
            if what == "completions"
            else f"Completions whose grading ended in {what[:-1]} (scored 0)",
            [],
            [((), f"grading{SEP}{what}")],
        )


def _counter(
    s: ServiceState,
    name: str,
    documentation: str,
    labels: list[str],
    series: list[tuple[tuple[str, ...], str]],
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=labels)
    for values, stat in series:
        family.add_metric(list(values), s.counters.get(stat, 0))
    return family


async def render(store: AsyncJobStore, settings: Settings) -> bytes:
    """The service's metrics in Prometheus' text format, appended to the API's own."""
    started = time.perf_counter()
    tenants = settings.tenants_by_key.values()
    state: ServiceState | None
    try:
        state = await asyncio.wait_for(read_state(store.redis, tenants), READ_SECONDS)
    except Exception as exc:  # a stall (TimeoutError) or an outage (RedisError): say so, serve
        log.warning("/metrics: could not read the service's state: %s", type(exc).__name__)
        state = None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(state, time.perf_counter() - started))
    return generate_latest(registry)
