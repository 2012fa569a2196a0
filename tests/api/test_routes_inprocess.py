"""Routes in-process (the real app over ASGI, a real redis-server), with their known answers:
liveness and readiness, and how the results routes pick JSON or CSV from `Accept`. Faster than
a started server, so the mutation run of `api/routes` (bench/mutation.toml, group "routes")
can afford them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aredis

from api.app import create_app
from api.deps import get_publisher
from api.routes.results import _format_from
from pdppo.settings import Settings
from pdppo.store.jobs.steering import AsyncSteering
from pdppo.store.jobs.worker_side import JobStore
from tests.support.inprocess import KEYS, call
from tests.support.seed import seed_job
from tests.support.specs import smoke_spec


@pytest.mark.parametrize(
    ("accept", "chosen"),
    [
        (None, "json"),
        ("", "json"),
        ("*/*", "json"),
        ("text/csv", "csv"),
        ("TEXT/CSV; q=0.9", "csv"),
        ("text/html, text/csv;q=0.5", "csv"),
        ("text/csv, application/json", "json"),  # asked for both: JSON
        ("application/json", "json"),
    ],
)
def test_results_answer_csv_only_when_asked_for_it_alone(accept: str | None, chosen: str) -> None:
    assert _format_from(accept) == chosen


def test_liveness_and_readiness(settings: Settings) -> None:
    healthy, ready = call(settings, ("alice", "/healthz", {}), ("alice", "/readyz", {}))
    assert (healthy.status_code, healthy.json()) == (200, {"status": "ok", "detail": None})
    assert (ready.status_code, ready.json()) == (200, {"status": "ok", "detail": None})
    low = settings.model_copy(update={"min_free_bytes": 1 << 62})  # no disk keeps that free
    (short,) = call(low, ("alice", "/readyz", {}))
    assert short.status_code == 200  # a low disk is reported, not unready
    assert short.json()["status"] == "ok"
    assert short.json()["detail"].startswith("disk: low (")


def test_why_a_job_has_no_final_model() -> None:
    from api.routes.artifacts import _has_final_model, _no_final_model
    from tests.support.seed import job

    said = {s: _no_final_model(job(s)) for s in ("succeeded", "queued", "paused", "failed")}
    assert said == {
        "succeeded": "job 'j1' has no final model in the artifact store",
        "queued": "job 'j1' has no final model yet (it is queued)",
        "paused": "job 'j1' has no final model yet (it is paused)",
        "failed": "job 'j1' has no final model (it is failed; only a succeeded job has one)",
    }
    assert [_has_final_model(job(s)) for s in ("succeeded", "running", "cancelled")] == [
        True,
        False,
        False,
    ]


class _ClaimingAtOnce:
    """A publisher whose worker claims the job before `submit` returns: the fastest a real
    worker can be. The CI run of stop 45 met it: the resume answered `running`, read back after
    the worker's claim."""

    def __init__(self, url: str) -> None:
        self.store = JobStore(redis.Redis.from_url(url, decode_responses=True))

    def submit(self, job_id: str, queue_name: str, priority: int = 0) -> None:
        assert self.store.claim(job_id, "w-fast")


def test_resume_answers_the_queued_job_it_made_before_a_worker_claims_it(
    settings: Settings,
    redis_url: str,
) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    seed_job(client, "j-paused", "paused", tenant="alice", spec=json.dumps(smoke_spec()))
    app = create_app(settings.model_copy(update={"api_publish_tasks": True}))
    fast = _ClaimingAtOnce(redis_url)
    app.dependency_overrides[get_publisher] = lambda: fast

    async def resume() -> httpx.Response:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
                headers = {"Authorization": f"Bearer {KEYS['alice']}"}
                return await http.post("/v1/jobs/j-paused/resume", headers=headers)

    answer = asyncio.run(resume())
    assert answer.status_code == 202, answer.text
    assert answer.json()["status"] == "queued"
    assert fast.store.get("j-paused").status == "running"  # type: ignore[union-attr]


class _Recording:
    """A publisher that records what it was asked to publish."""

    def __init__(self) -> None:
        self.published: list[tuple[str, str]] = []

    def submit(self, job_id: str, queue_name: str, priority: int = 0) -> None:
        self.published.append((job_id, queue_name))


def test_a_new_job_is_published_once_and_a_replay_is_marked_and_not_published_again(
    settings: Settings,
) -> None:
    recording = _Recording()

    def submit_twice(publish: bool, key: str) -> list[httpx.Response]:
        app = create_app(settings.model_copy(update={"api_publish_tasks": publish}))
        app.dependency_overrides[get_publisher] = lambda: recording

        async def run() -> list[httpx.Response]:
            async with app.router.lifespan_context(app):
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
                    headers = {"Authorization": f"Bearer {KEYS['alice']}", "Idempotency-Key": key}
                    return [
                        await http.post("/v1/jobs", json=smoke_spec(), headers=headers)
                        for _ in range(2)
                    ]

        return asyncio.run(run())

    first, again = submit_twice(True, "k1")
    assert (first.status_code, again.status_code) == (201, 201)
    assert "Idempotent-Replayed" not in first.headers
    assert again.headers["Idempotent-Replayed"] == "true"
    assert first.json()["id"] == again.json()["id"]
    assert recording.published == [(first.json()["id"], "cpu")]
    # a new job of a process that leaves publishing to the outbox (PDPPO_API_PUBLISH_TASKS=0)
    quiet, _ = submit_twice(False, "k2")
    assert quiet.status_code == 201 and quiet.json()["id"] != first.json()["id"]
    assert recording.published == [(first.json()["id"], "cpu")]


TOKEN = "w1:0123456789abcdef"  # the lease of the worker running the job


def _hand_back(url: str) -> None:
    """The job's worker stops it and hands it back, as it does once it saw the pause."""
    store = JobStore(redis.Redis.from_url(url, decode_responses=True))
    job = store.get("j1")
    assert job is not None
    store.requeue_if_orphaned(job, "stopped", lease_token=TOKEN)


def _resume(url: str) -> None:
    """Another client resumes the job."""

    async def main() -> None:
        conn = aredis.Redis.from_url(url, decode_responses=True)
        try:
            await AsyncSteering(conn).resume("j1", tenant="alice", max_active=5)
        finally:
            await conn.aclose()

    with ThreadPoolExecutor(1) as pool:  # a loop of its own, as another API process has
        pool.submit(asyncio.run, main()).result()


# (seeded state, what happens right after the pause script and before the answer is made,
# the answer: status code, the job's status, its pause_requested)
PAUSE_ROWS = [
    ("queued", None, (202, "paused", False)),
    ("running", None, (202, "running", True)),
    ("running", _hand_back, (202, "running", True)),
    ("running+pause", None, (202, "running", True)),
    ("running+pause", _hand_back, (202, "running", True)),
    ("paused", None, (202, "paused", False)),
    ("paused", _resume, (202, "paused", False)),
    ("running+cancel", None, (409, None, None)),
    ("succeeded", None, (409, None, None)),
]


@pytest.mark.parametrize(
    ("state", "between", "expected"),
    PAUSE_ROWS,
    ids=[f"{s}-{b.__name__ if b else 'alone'}" for s, b, _ in PAUSE_ROWS],
)
def test_pause_answers_the_job_as_its_script_left_it(
    state: str,
    between: Callable[[str], None] | None,
    expected: tuple[int, str | None, bool | None],
    settings: Settings,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the answer says is the moment of the pause, not of a read after it: a worker that
    carries the pause out (or a resume) in between must not make a request answer `paused`."""
    status, _, flag = state.partition("+")
    fields = {f"{flag}_requested": "1"} if flag else {}
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    token = TOKEN if status == "running" else None
    seed_job(client, "j1", status, tenant="alice", lease_token=token, **fields)
    pause = AsyncSteering.pause

    async def pause_then(self: AsyncSteering, job_id: str) -> Any:
        done = await pause(self, job_id)
        if between is not None:
            between(redis_url)
        return done

    monkeypatch.setattr(AsyncSteering, "pause", pause_then)
    (answer,) = call(settings, ("alice", "/v1/jobs/j1/pause", {"json": {}}))
    body = answer.json()
    got = (answer.status_code, body.get("status"), body.get("pause_requested"))
    assert got == expected, answer.text
