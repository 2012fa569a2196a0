"""What `GET /v1/fine_tuning/jobs?metadata[k]=v` costs as a tenant's jobs grow: the route has no
metadata index, so it reads the tenant's jobs newest first until a page of matches is full, all
of them when fewer match (`api.openai.routes.list_fine_tuning_jobs`).

One job is made through the route itself (its spec and OpenAI request as the route stores them);
its hash is then copied to N jobs of the tenant in a real redis-server, each with metadata
`{"i": "<n>", "set": "bench"}`. Timed in-process (the real app over ASGI, so no network): a
listing with no filter, a filter the newest job matches, one only the oldest matches, and one
nothing matches (the last two read every job without the metadata index). The copies are
written straight to Redis, as jobs made before the index would be: the first filtered listing
adds them to it (`pdppo.store.metadata`, once), so it is timed on its own. Run:

    PYTHONPATH=$PWD .venv/bin/python bench/openai_list_metadata.py [N ...]
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import redis

from api.app import create_app
from pdppo.settings import Settings
from pdppo.store.keys import job_key, tenant_jobs_key
from tests.support.openai_inprocess import METHOD, ROWS, SMALL
from tests.support.stack import RedisServer

KEY = "alice-key-0123456789"
REPEATS = 5


async def made_job(http: httpx.AsyncClient) -> str:
    files = {"file": ("d.jsonl", ROWS, "application/x-ndjson")}
    training = (await http.post("/v1/files", files=files, data={"purpose": "fine-tune"})).json()
    body = {"model": "builtin:tiny", "training_file": training["id"], "method": METHOD}
    made = await http.post("/v1/fine_tuning/jobs", json={**body, "pdppo": SMALL})
    assert made.status_code == 200, made.text
    return str(made.json()["id"]).removeprefix("ftjob-")


def copies(client: redis.Redis, template: str, n: int) -> None:
    """N jobs of alice like `template`, ids oldest first, each with its own metadata."""
    raw = {k.decode(): v.decode() for k, v in client.hgetall(job_key(template)).items()}
    client.delete(job_key(template))
    client.zrem(tenant_jobs_key("alice"), template)
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        job_id = f"{1_700_000_000_000 + i:012x}{i:012x}"
        made = json.loads(raw["openai"])
        made["request"]["metadata"] = {"i": str(i), "set": "bench"}
        pipe.hset(job_key(job_id), mapping={**raw, "id": job_id, "openai": json.dumps(made)})
        pipe.zadd(tenant_jobs_key("alice"), {job_id: 0})
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()


async def timed(http: httpx.AsyncClient, params: dict[str, str]) -> tuple[float, int]:
    """(median ms a listing, jobs answered)."""
    times, count = [], 0
    for _ in range(REPEATS):
        start = time.perf_counter()
        answer = await http.get("/v1/fine_tuning/jobs", params=params)
        times.append((time.perf_counter() - start) * 1000)
        assert answer.status_code == 200, answer.text
        count = len(answer.json()["data"])
    return statistics.median(times), count


async def measure(settings: Settings, client: redis.Redis, n: int) -> None:
    client.flushdb()
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://api", headers=headers, timeout=120
        ) as http:
            copies(client, await made_job(http), n)
            start = time.perf_counter()
            first = await http.get("/v1/fine_tuning/jobs", params={"metadata[i]": "0"})
            assert first.status_code == 200, first.text
            took = (time.perf_counter() - start) * 1000
            print(f"{n} jobs, the first filtered listing: {took:.1f} ms (once; see below)")
            cases = {
                "no filter": {},
                "the newest matches": {"metadata[i]": str(n - 1)},
                "the oldest matches": {"metadata[i]": str(0)},
                "nothing matches": {"metadata[i]": "none"},
            }
            for name, params in cases.items():
                ms, count = await timed(http, params)
                print(f"{n} jobs, {name}: {ms:.1f} ms a listing ({count} answered)")


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [1000, 10000]
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis")
        try:
            settings = Settings(  # type: ignore[call-arg]
                redis_url=server.url(0),
                api_keys=f"alice:{KEY}",
                artifact_dir=Path(tmp) / "artifacts",
                min_free_bytes=0,
                api_publish_tasks=False,
                _env_file=None,
            )
            client = redis.Redis.from_url(server.url(0))
            for n in sizes:
                asyncio.run(measure(settings, client, n))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
