"""The fair order of queued jobs (`pdppo.store.jobs.fair`) against a real redis-server, as a table:
each row a sequence of requests through the store's own methods (create as the API does, start as
a worker does: the next job of the queue, then its claim; cancel, pause, resume, a lost worker's
requeue) and the order the jobs were started in.

Jobs are named by tenant (`a`, `b`), flow (`p` plain, `e`/`f` an experiment) and number; ids are
made in that order of creation, so a flow's jobs keep it. Before the fair order, a worker started
whatever its Celery queue held first: bob's backlog before alice's first job, every plain job
before any experiment's child.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import NamedTuple

import pytest
import redis
import redis.asyncio as aredis

from pdppo.store import JobStore
from pdppo.store.jobs.api_side import AsyncJobStore
from pdppo.store.jobs.steering import AsyncSteering
from pdppo.store.keys import FAIR_PREFIX, lease_key
from tests.support.stack import RedisServer

TENANTS = {"a": "alice", "b": "bob"}


class Row(NamedTuple):
    name: str
    steps: str  # space-separated: `+b.p1` create, `>` start the next (cpu), `>gpu`, `x a.p2`
    # cancel, `|| a.p1` pause, `|> a.p1` resume, `~ a.p1` its worker died (requeued)
    started: str  # what each `>` started, in order (`-`: none)


# fmt: off
ROWS = [
    Row("one tenant's plain jobs run in order",
        "+a.p1 +a.p2 +a.p3 > > > >", "a.p1 a.p2 a.p3 -"),
    Row("a tenant arriving behind another's backlog waits one job, then they take turns",
        "+b.p1 +b.p2 +b.p3 +b.p4 +a.p1 +a.p2 > > > > > >", "b.p1 a.p1 b.p2 a.p2 b.p3 b.p4"),
    Row("an experiment does not wait for another tenant's stream of plain jobs",
        "+a.p1 +a.p2 +a.p3 > +b.e1 +b.e2 +a.p4 > > > > >", "a.p1 b.e1 a.p2 b.e2 a.p3 a.p4"),
    Row("a tenant's plain job does not wait behind its own experiment's first child",
        "+a.e1 +a.e2 +a.e3 +a.p1 > > > >", "a.p1 a.e1 a.e2 a.e3"),
    Row("a tenant's experiment takes turns with its stream of plain jobs",
        "+a.p1 > +a.e1 +a.e2 +a.p2 +a.p3 > > > >", "a.p1 a.e1 a.p2 a.e2 a.p3"),
    Row("two experiments of one tenant take turns",
        "+a.e1 +a.e2 +a.f1 +a.f2 > > > >", "a.e1 a.f1 a.e2 a.f2"),
    Row("a tenant submitting one job at a time gets its turn, not every turn",
        "+a.p1 +b.p1 +b.p2 +b.p3 > +a.p2 > > +a.p3 > > >", "a.p1 b.p1 a.p2 b.p2 a.p3 b.p3"),
    Row("cancelled and paused jobs are passed over; a resumed one takes its place again",
        "+a.p1 +a.p2 +a.p3 || a.p1 x a.p2 > |> a.p1 > >", "a.p3 a.p1 -"),
    Row("a job whose worker died goes back to its place at the head of its flow",
        "+a.p1 +a.p2 > ~ a.p1 > > >", "a.p1 a.p1 a.p2 -"),
    Row("queues are apart: a gpu worker starts gpu jobs only",
        "+a.p1 +b.g1 >gpu >gpu > >", "b.g1 - a.p1 -"),
]
# fmt: on


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("fair"))
    yield server
    server.stop()


@pytest.fixture
def r(shared: RedisServer) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(shared.url(), decode_responses=True)
    conn.flushdb()
    yield conn
    conn.close()


class Harness:
    """Runs a row's steps: the API's requests on an asyncio client, a worker's on a sync one."""

    def __init__(self, client: redis.Redis, url: str) -> None:
        self.store = JobStore(client)
        self.url = url
        self.ids: dict[str, str] = {}
        self.names: dict[str, str] = {}

    def api(self, work: str, label: str) -> None:
        async def main() -> None:
            conn = aredis.Redis.from_url(self.url, decode_responses=True)
            try:
                if work == "+":
                    await self._create(AsyncJobStore(conn), label)
                elif work == "x":
                    assert (await AsyncJobStore(conn).cancel(self.ids[label])).startswith("cancel")
                elif work == "||":
                    assert (await AsyncSteering(conn).pause(self.ids[label])).outcome == "paused"
                else:
                    assert await AsyncSteering(conn).resume(self.ids[label]) == "queued"
            finally:
                await conn.aclose()

        asyncio.run(main())

    async def _create(self, store: AsyncJobStore, label: str) -> None:
        tenant, job = label.split(".")
        job_id = f"{len(self.ids) + 1:012x}{'0' * 12}"  # time-ordered, as new_job_id makes them
        made = await store.create(
            tenant=TENANTS[tenant],
            queue="gpu" if job.startswith("g") else "cpu",
            name=label,
            spec_json="{}",
            total_steps=1,
            max_active=100,
            idempotency=None,
            idempotency_ttl=0,
            job_id=job_id,
            experiment=f"exp-{tenant}-{job[0]}" if job[0] in "ef" else None,
        )
        assert made.outcome == "created"
        self.ids[label], self.names[job_id] = job_id, label

    def start(self, queue: str) -> str:
        """What a free worker of `queue` starts: the next job, claimed."""
        job_id = self.store.fair.next(queue)
        if job_id is None:
            return "-"
        assert self.store.claim(job_id, "w1")
        return self.names[job_id]

    def lost(self, label: str) -> None:
        """Its worker died: the lease ran out and a reaper requeues it."""
        job = self.store.get(self.ids[label])
        assert job is not None
        self.store.redis.delete(lease_key(job.id))
        assert self.store.requeue_if_orphaned(job) == "requeued"


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_the_fair_order(row: Row, r: redis.Redis, shared: RedisServer) -> None:
    harness = Harness(r, shared.url())
    started: list[str] = []
    words = row.steps.split()
    while words:
        word = words.pop(0)
        if word.startswith("+"):
            harness.api("+", word[1:])
        elif word.startswith(">"):
            started.append(harness.start(word[1:] or "cpu"))
        elif word == "~":
            harness.lost(words.pop(0))
        else:
            harness.api(word, words.pop(0))
    assert " ".join(started) == row.started
    if started[-1] == "-":  # nothing left to start: the index is empty but for the turns
        left = sorted(k for k in r.scan_iter(f"{FAIR_PREFIX}*") if not k.endswith(":served"))
        assert left == [f"{FAIR_PREFIX}arrivals", f"{FAIR_PREFIX}turn"]


def test_an_entry_whose_job_is_no_longer_queued_is_dropped_on_the_way(
    r: redis.Redis, shared: RedisServer
) -> None:
    """A job that left the queue by a path that did not take it out of the order (a record
    written by an older version, a seeded test) is passed over, and its entry dropped."""
    harness = Harness(r, shared.url())
    for label in ("a.p1", "a.p2", "b.p1"):
        harness.api("+", label)
    r.hset(f"pdppo:job:{harness.ids['a.p1']}", "status", "running")
    r.delete(f"pdppo:job:{harness.ids['b.p1']}")
    assert [harness.start("cpu") for _ in range(2)] == ["a.p2", "-"]
    assert list(r.scan_iter(f"{FAIR_PREFIX}cpu:tenant:*:flow:*")) == []


def test_the_outbox_adoption_puts_jobs_queued_before_the_order_existed_in_it(
    r: redis.Redis, shared: RedisServer
) -> None:
    """A deployment upgraded with jobs queued: a worker's start adopts them (`adopt_queued`),
    each into its flow, so that the order holds every queued job from then on."""
    harness = Harness(r, shared.url())
    for label in ("b.p1", "a.e1", "a.p1"):
        harness.api("+", label)
    for key in list(r.scan_iter(f"{FAIR_PREFIX}*")):
        r.delete(key)  # as a version without the order left them
    assert harness.start("cpu") == "-"
    assert harness.store.outbox.adopt_queued() == 0  # all in the outbox already
    started = [harness.start("cpu") for _ in range(4)]
    # the tenants in the order the adoption met them (a scan's), taking turns; alice's plain job
    # before her experiment's child, as when they are made
    assert started in (["a.p1", "b.p1", "a.e1", "-"], ["b.p1", "a.p1", "a.e1", "-"])
