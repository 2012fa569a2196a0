"""The service's state as `/metrics` renders it (`api.http.service_metrics`), read from a real
Redis: known jobs, workers and counters give known values, label sets stay bounded, and a stalled
Redis gives a prompt scrape that says the read failed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aredis
from prometheus_client.parser import text_string_to_metric_families

from api.http import service_metrics
from pdppo.settings import Settings
from pdppo.store import JobStore, job_key
from pdppo.store.jobs.api_side import AsyncJobStore
from pdppo.store.stats import STATS, WORKERS
from tests.support.stack import RedisServer, stall

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def conn(server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url(), decode_responses=True)
    yield client
    client.close()


def settings(server: RedisServer) -> Settings:
    return Settings(  # type: ignore[call-arg]
        redis_url=server.url(), api_keys="alice:k-alice,bob:k-bob", _env_file=None
    )


def parse(text: bytes) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


async def _scrape(server: RedisServer, setup: bool) -> tuple[Samples, float]:
    client = aredis.Redis.from_url(server.url(), decode_responses=True)
    store = AsyncJobStore(client)
    try:
        if setup:
            jobs = (("alice", "cpu"), ("alice", "cpu"), ("bob", "cpu"), ("bob", "gpu"))
            for tenant, queue in jobs:
                await store.create(
                    tenant=tenant,
                    queue=queue,
                    name=None,
                    spec_json="{}",
                    total_steps=10,
                    max_active=10,
                    idempotency=None,
                    idempotency_ttl=0,
                )
        started = time.monotonic()
        text = await service_metrics.render(store, settings(server))
        return parse(text), time.monotonic() - started
    finally:
        await client.aclose()


def scrape(server: RedisServer, setup: bool = False) -> tuple[Samples, float]:
    return asyncio.run(_scrape(server, setup))


def test_known_jobs_workers_and_counters_read_as_known_values(
    server: RedisServer, conn: redis.Redis
) -> None:
    scrape(server, setup=True)  # 3 cpu jobs (alice 2, bob 1), 1 gpu job: all queued
    ids = sorted(conn.zrange("pdppo:outbox", 0, -1))
    cpu = [i for i in ids if conn.hget(job_key(i), "queue") == "cpu"]
    store = JobStore(conn)
    assert store.claim(cpu[0], "host:11")  # running on host:11
    conn.hset(job_key(cpu[1]), "status", "paused")  # as a pause of a queued job leaves it
    conn.zrem("pdppo:outbox", cpu[1])
    gpu = next(i for i in ids if i not in cpu)
    conn.hset(job_key(gpu), "queued_at", "2020-01-01T00:00:00.000Z")  # queued for years
    now = time.time()
    conn.zadd(WORKERS, {"host:11": now - 2, "host:12": now - 100})
    conn.hset(
        STATS,
        mapping={
            "ended|cpu|succeeded|": 5,
            "ended|cpu|failed|storage_full": 2,
            "ended|cpu|failed|made_up_code": 1,
            "ended|weird queue|cancelled|": 1,
            "lease_renewals": 40,
            "lease_losses|unreachable": 1,
            "reconciler|requeued": 3,
            "grading|completions": 64,
            "grading|errors": 4,
        },
    )
    m, _ = scrape(server)

    def v(name: str, **labels: str) -> float:
        return m[(name, tuple(sorted(labels.items())))]

    assert v("pdppo_service_state_up") == 1
    assert v("pdppo_jobs", queue="cpu", status="queued") == 1
    assert v("pdppo_jobs", queue="cpu", status="running") == 1
    assert v("pdppo_jobs", queue="cpu", status="paused") == 1
    assert v("pdppo_jobs", queue="gpu", status="queued") == 1
    assert v("pdppo_queue_depth", queue="cpu") == 1
    assert v("pdppo_queue_depth", queue="gpu") == 1
    assert v("pdppo_queue_oldest_job_age_seconds", queue="gpu") > 3 * 365 * 86400
    assert v("pdppo_queue_oldest_job_age_seconds", queue="cpu") < 60
    assert v("pdppo_outbox_depth") == 2  # the queued ones
    assert v("pdppo_workers_alive") == 1  # host:12 last beat 100 s ago
    assert 99 < v("pdppo_worker_last_beat_age_seconds", worker="host:12") < 120
    assert v("pdppo_worker_running_jobs", worker="host:11") == 1
    assert v("pdppo_worker_running_jobs", worker="host:12") == 0
    assert v("pdppo_jobs_ended_total", queue="cpu", status="succeeded", code="none") == 5
    assert v("pdppo_jobs_ended_total", queue="cpu", status="failed", code="storage_full") == 2
    assert v("pdppo_jobs_ended_total", queue="cpu", status="failed", code="other") == 1
    assert v("pdppo_jobs_ended_total", queue="other", status="cancelled", code="none") == 1
    assert v("pdppo_jobs_ended_total", queue="gpu", status="failed", code="worker_lost") == 0
    assert v("pdppo_lease_renewals_total") == 40
    assert v("pdppo_lease_losses_total", reason="unreachable") == 1
    assert v("pdppo_lease_losses_total", reason="taken") == 0
    assert v("pdppo_reconciler_actions_total", action="requeued") == 3
    assert v("pdppo_reconciler_actions_total", action="task_sent") == 0
    assert v("pdppo_grading_completions_total") == 64
    assert v("pdppo_grading_errors_total") == 4
    assert v("pdppo_grading_timeouts_total") == 0
    # bounded: no label value the data did not map to a known one
    codes = {dict(labels).get("code") for (name, labels) in m if name == "pdppo_jobs_ended_total"}
    assert "made_up_code" not in codes
    queues = {dict(labels)["queue"] for (name, labels) in m if name == "pdppo_jobs"}
    assert queues == {"cpu", "gpu", "other"}


def test_a_stalled_redis_gives_a_prompt_scrape_that_says_so(
    server: RedisServer, conn: redis.Redis
) -> None:
    conn.hset(STATS, "lease_renewals", 7)
    sleeper = stall(server, 4)
    m, took = scrape(server)
    assert took < service_metrics.READ_SECONDS + 0.5
    assert m[("pdppo_service_state_up", ())] == 0
    assert not [name for name, _ in m if name.startswith("pdppo_jobs")]
    assert ("pdppo_lease_renewals_total", ()) not in m  # no value rather than a stale one
    sleeper.join()
    m, _ = scrape(server)
    assert m[("pdppo_service_state_up", ())] == 1
    assert m[("pdppo_lease_renewals_total", ())] == 7
