"""`GET /v1/fine_tuning/jobs?metadata[k]=v` from the metadata index (`pdppo.store.metadata`),
driven by the `openai` SDK in-process (test_openai_routes' setup, a real redis-server): pages at
the limit, jobs made before the index, entries without a job, and a listing that reads the index
rather than every job."""

from __future__ import annotations

import json
from typing import Any

import redis
from openai import AsyncOpenAI

from pdppo.settings import Settings
from pdppo.store.keys import (
    job_key,
    tenant_jobs_key,
    tenant_metadata_key,
    tenant_metadata_ready_key,
)
from tests.support.openai_inprocess import create, run


def ids(page: Any) -> list[str]:
    return [j.id for j in page.data]


def test_filtered_pages_stop_at_the_limit_and_go_on_after_it(settings: Settings) -> None:
    async def work(sdk: AsyncOpenAI) -> None:
        made = [await create(sdk, metadata={"set": "x" if i != 1 else "y"}) for i in range(4)]
        xs = [made[3].id, made[2].id, made[0].id]  # newest first, without the "y"
        first = await sdk.fine_tuning.jobs.list(metadata={"set": "x"}, limit=2)
        assert (ids(first), first.has_more) == (xs[:2], True)
        rest = await sdk.fine_tuning.jobs.list(metadata={"set": "x"}, limit=2, after=xs[1])
        assert (ids(rest), rest.has_more) == (xs[2:], False)
        exact = await sdk.fine_tuning.jobs.list(metadata={"set": "x"}, limit=3)
        assert (ids(exact), exact.has_more) == (xs, False)
        assert ids(await sdk.fine_tuning.jobs.list(metadata={"set": "z"})) == []
        every = await sdk.fine_tuning.jobs.list(limit=3)  # no filter: the tenant's list
        assert (ids(every), every.has_more) == ([j.id for j in made[:0:-1]], True)

    run(settings, work)


def test_every_pair_must_match_not_only_the_one_walked(settings: Settings) -> None:
    async def work(sdk: AsyncOpenAI) -> None:
        pairs = [{"a": "1", "b": "1"}, {"a": "1", "b": "2"}, {"a": "2", "b": "2"}, {"b": "2"}]
        made = [(await create(sdk, metadata=m)).id for m in pairs]
        # a=1 has the fewer jobs (2 of them), so it is walked; b=2 is checked on each
        assert ids(await sdk.fine_tuning.jobs.list(metadata={"a": "1", "b": "2"})) == [made[1]]
        both = await sdk.fine_tuning.jobs.list(metadata={"b": "2", "a": "2"})
        assert ids(both) == [made[2]]

    run(settings, work)


def test_jobs_made_before_the_index_are_found_once_it_is_built(
    settings: Settings,
    redis_url: str,
) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)

    async def work(sdk: AsyncOpenAI) -> None:
        old = await create(sdk, metadata={"team": "rl"})
        # as a server before the index left it: the job, no entries, no ready key
        client.delete(
            tenant_metadata_key("alice", "team", "rl"), tenant_metadata_ready_key("alice")
        )
        assert ids(await sdk.fine_tuning.jobs.list(metadata={"team": "rl"})) == [old.id]
        assert client.get(tenant_metadata_ready_key("alice")) == "1"
        new = await create(sdk, metadata={"team": "rl"})
        page = await sdk.fine_tuning.jobs.list(metadata={"team": "rl"})
        assert ids(page) == [new.id, old.id]

    run(settings, work)


def test_the_first_filtered_listing_adds_every_earlier_job_past_a_batch(
    settings: Settings,
    redis_url: str,
) -> None:
    """More jobs than `ensure` reads at once (500), made before the index: the oldest is found."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)

    async def work(sdk: AsyncOpenAI) -> list[str]:
        template = (await create(sdk, metadata={"n": "x"})).id.removeprefix("ftjob-")
        raw = client.hgetall(job_key(template))
        pipe = client.pipeline(transaction=False)
        for i in range(600):  # older than the template, oldest first
            copy = f"{i:024x}"
            made = json.loads(raw["openai"])
            made["request"]["metadata"] = {"n": str(i)}
            pipe.hset(job_key(copy), mapping={**raw, "id": copy, "openai": json.dumps(made)})
            pipe.zadd(tenant_jobs_key("alice"), {copy: 0})
        pipe.delete(tenant_metadata_ready_key("alice"))
        pipe.execute()
        oldest = await sdk.fine_tuning.jobs.list(metadata={"n": "0"})
        return ids(oldest)

    assert run(settings, work) == [f"ftjob-{0:024x}"]


def test_entries_without_a_job_are_skipped_and_old_ones_dropped(
    settings: Settings,
    redis_url: str,
) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    key = tenant_metadata_key("alice", "run", "a")

    async def work(sdk: AsyncOpenAI) -> None:
        kept = await create(sdk, metadata={"run": "a"})
        deleted = await create(sdk, metadata={"run": "a"})
        client.delete(job_key(deleted.id.removeprefix("ftjob-")))  # young: maybe still landing
        stale = "000000000001" + "ab" * 6  # an entry whose create never came, long ago
        client.zadd(key, {stale: 0})
        assert ids(await sdk.fine_tuning.jobs.list(metadata={"run": "a"})) == [kept.id]
        assert sorted(client.zrange(key, 0, -1)) == sorted(
            [kept.id.removeprefix("ftjob-"), deleted.id.removeprefix("ftjob-")]
        )

    run(settings, work)


def test_a_filtered_listing_reads_the_index_not_every_job(
    settings: Settings,
    redis_url: str,
) -> None:
    """A job in the tenant's list with the pair but no entry (which no server writes) is not
    found: the listing did not walk the tenant's jobs (bench/openai_list_metadata.py times it)."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)

    async def work(sdk: AsyncOpenAI) -> None:
        indexed = await create(sdk, metadata={"k": "v"})
        assert ids(await sdk.fine_tuning.jobs.list(metadata={"k": "v"})) == [indexed.id]  # built
        native = indexed.id.removeprefix("ftjob-")
        unindexed = native[:-1] + ("0" if native[-1] != "0" else "1")
        client.hset(
            job_key(unindexed), mapping={**client.hgetall(job_key(native)), "id": unindexed}
        )
        client.zadd(tenant_jobs_key("alice"), {unindexed: 0})
        assert ids(await sdk.fine_tuning.jobs.list(metadata={"k": "v"})) == [indexed.id]
        assert f"ftjob-{unindexed}" in ids(await sdk.fine_tuning.jobs.list())

    run(settings, work)
