"""`/v1/fine_tuning/...` in-process: the official `openai` SDK over an ASGI transport to the real
app, with a real redis-server and no worker (jobs stay queued; their events, metrics and
checkpoints are written the way a worker writes them). Faster than the started stack of
tests/integration/test_openai_sdk.py, so the `openai` mutation group's quick run affords it:
pagination edges, the SDK's retry key, admission's param, the error middleware."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import openai
import pytest
import redis
from openai import AsyncOpenAI

from api.openai.errors import OpenAIErrors
from pdppo.settings import Settings
from pdppo.store.keys import events_key, job_key, metrics_key
from tests.support.inprocess import KEYS
from tests.support.openai_inprocess import GRADER, METHOD, SMALL, create, run, upload


def test_listing_pages_at_the_limit_and_filters_on_metadata(settings: Settings) -> None:
    async def work(sdk: AsyncOpenAI) -> None:
        made = [await create(sdk, metadata={"i": str(i), "set": "x"}) for i in range(3)]
        newest = [j.id for j in reversed(made)]
        page = await sdk.fine_tuning.jobs.list(limit=3)
        assert ([j.id for j in page.data], page.has_more) == (newest, False)
        page = await sdk.fine_tuning.jobs.list(limit=2)
        assert ([j.id for j in page.data], page.has_more) == (newest[:2], True)
        page = await sdk.fine_tuning.jobs.list(limit=2, after=newest[1])
        assert ([j.id for j in page.data], page.has_more) == (newest[2:], False)
        page = await sdk.fine_tuning.jobs.list(metadata={"i": "1", "set": "x"})
        assert [j.id for j in page.data] == [made[1].id]
        assert (await sdk.fine_tuning.jobs.list(metadata={"i": "1", "set": "y"})).data == []
        assert [j.metadata for j in page.data] == [{"i": "1", "set": "x"}]

    run(settings, work)


def test_a_job_shows_its_model_status_and_what_a_native_job_lacks(
    settings: Settings,
    redis_url: str,
) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)

    async def work(sdk: AsyncOpenAI) -> Any:
        before = int(time.time())
        job = await create(sdk)
        assert before <= job.created_at <= time.time() and job.finished_at is None
        assert (job.status, job.fine_tuned_model, job.model) == ("queued", None, "builtin:tiny")
        native_id = job.id.removeprefix("ftjob-")
        ended = "2026-01-02T03:04:05+00:00"
        client.hset(job_key(native_id), mapping={"status": "succeeded", "finished_at": ended})
        done = await sdk.fine_tuning.jobs.retrieve(job.id)
        assert (done.status, done.fine_tuned_model) == ("succeeded", f"job:{native_id}")
        assert done.finished_at == 1767323045
        client.hdel(job_key(native_id), "openai")  # as a job made with POST /v1/jobs
        native = await sdk.fine_tuning.jobs.retrieve(native_id)  # the native id works too
        assert (native.id, native.model, native.metadata) == (job.id, "builtin:tiny", None)
        assert native.method is not None and native.method.to_dict() == {
            "type": "reinforcement",
            "reinforcement": {"grader": GRADER, "hyperparameters": {}},
        }

    run(settings, work)


def test_events_page_newest_first_and_checkpoints_carry_their_steps_metrics(
    settings: Settings,
    redis_url: str,
) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)

    async def work(sdk: AsyncOpenAI) -> None:
        job = await create(sdk)
        native_id = job.id.removeprefix("ftjob-")
        for step in (1, 2, 3, 4):
            data = {"step": step, "total": 4, "metrics": {"reward_mean": step / 10}}
            client.xadd(events_key(native_id), {"type": "metrics", "data": json.dumps(data)})
            client.rpush(
                metrics_key(native_id), json.dumps({"step": step, "metrics": data["metrics"]})
            )
        for step in (2, 4):
            folder = settings.artifact_dir / native_id / "checkpoints" / f"step-{step:06d}"
            folder.mkdir(parents=True)
            (folder / "weights").write_bytes(b"w" * step)
        events = await sdk.fine_tuning.jobs.list_events(job.id, limit=2)
        assert [e.data["step"] for e in events.data] == [4, 3] and events.has_more
        rest = await sdk.fine_tuning.jobs.list_events(job.id, limit=10, after=events.data[-1].id)
        assert [e.type for e in rest.data] == ["metrics", "metrics", "message"]  # then: queued
        assert [e.message for e in rest.data] == ["step 2/4", "step 1/4", "Job queued"]
        assert not rest.has_more
        checkpoints = await sdk.fine_tuning.jobs.checkpoints.list(job.id)
        assert [c.step_number for c in checkpoints.data] == [4, 2]
        assert checkpoints.data[0].metrics.to_dict() == {"step": 4.0, "reward_mean": 0.4}
        assert checkpoints.data[1].fine_tuned_model_checkpoint == (
            f"/v1/jobs/{native_id}/checkpoints/step-000002"
        )
        after = await sdk.fine_tuning.jobs.checkpoints.list(job.id, after=checkpoints.data[0].id)
        assert [c.step_number for c in after.data] == [2]
        assert (after.first_id, after.last_id, after.has_more) == (
            f"ftckpt-{native_id}-2",
            f"ftckpt-{native_id}-2",
            False,
        )
        one = await sdk.fine_tuning.jobs.checkpoints.list(job.id, limit=1)
        assert ([c.step_number for c in one.data], one.has_more) == ([4], True)

    run(settings, work)


def test_the_sdks_retry_gets_the_job_its_first_attempt_made(settings: Settings) -> None:
    async def attempt(sdk: AsyncOpenAI, training: str, count: str) -> str:
        headers = {"x-stainless-retry-count": count}
        job = await sdk.fine_tuning.jobs.create(
            model="builtin:tiny",
            training_file=training,
            method=METHOD,  # type: ignore[arg-type]
            extra_body={"pdppo": SMALL},
            extra_headers=headers,
        )
        return job.id

    async def work(sdk: AsyncOpenAI) -> None:
        training = await upload(sdk)
        first = await attempt(sdk, training, "0")
        assert await attempt(sdk, training, "1") == first  # a retry of it
        assert await attempt(sdk, training, "2") == first
        again = await attempt(sdk, training, "0")  # a new call of the same request
        assert again != first
        assert await attempt(sdk, training, "1") == again
        # a count that is not a number is no SDK's: no key, a new job each time
        odd = [await attempt(sdk, training, "x") for _ in range(2)]
        assert len({first, again, *odd}) == 4

    run(settings, work)


def test_admission_refusals_name_the_first_problems_param(settings: Settings) -> None:
    async def work(sdk: AsyncOpenAI) -> None:
        with pytest.raises(openai.BadRequestError) as caught:
            await sdk.fine_tuning.jobs.create(
                model="hf:/etc",  # outside the data roots: the first problem
                training_file=await upload(sdk),
                validation_file="file-" + "0" * 32,  # never uploaded: the second
                method=METHOD,  # type: ignore[arg-type]
            )
        assert caught.value.param == "model"
        assert "'hf:/etc' local paths are disabled on this server" in caught.value.message
        assert "file 'file-00000000000000000000000000000000' not found" in caught.value.message

    run(settings, work)


def test_errors_say_whether_a_retry_can_help(settings: Settings) -> None:
    async def work(sdk: AsyncOpenAI) -> None:
        job = await create(sdk)
        await sdk.fine_tuning.jobs.cancel(job.id)
        with pytest.raises(openai.ConflictError) as conflict:
            await sdk.fine_tuning.jobs.pause(job.id)
        assert conflict.value.response.headers["x-should-retry"] == "false"
        with pytest.raises(openai.BadRequestError) as bad:  # two schema errors: the first named
            await sdk.fine_tuning.jobs.create(
                model="builtin:tiny",
                training_file="nope",
                seed=-1,
                method=METHOD,  # type: ignore[arg-type]
            )
        assert bad.value.response.headers["x-should-retry"] == "false"
        assert bad.value.param == "training_file" and "seed" in bad.value.message

    run(settings, work)


def test_a_grader_that_cannot_score_a_sample_gives_zero_and_says_why(
    settings: Settings,
) -> None:
    multi = {
        "type": "multi",
        "name": "m",
        "graders": {"a": {**GRADER, "name": "a"}, "b": {**GRADER, "name": "b"}},
        "calculate_output": "a / b",
    }

    async def work(sdk: AsyncOpenAI) -> None:
        graders = sdk.fine_tuning.alpha.graders
        ok = await graders.run(grader=multi, model_sample="1", item={"answer": "1"})  # type: ignore[arg-type]
        assert (ok.reward, ok.sub_rewards) == (1.0, {"a": 1.0, "b": 1.0})
        zero = await graders.run(grader=multi, model_sample="2", item={"answer": "1"})  # type: ignore[arg-type]
        assert (zero.reward, zero.sub_rewards) == (0.0, {})
        assert zero.metadata.errors.formula_parse_error
        assert zero.metadata.scores == {"error": "float division by zero"}
        missing = await graders.run(grader=GRADER, model_sample="1", item={})  # type: ignore[arg-type]
        assert (missing.reward, missing.metadata.errors.invalid_variable_error) == (0.0, True)

    run(settings, work)


def test_the_error_middleware_rewrites_only_openai_paths_and_passes_other_scopes() -> None:
    sent: list[dict[str, Any]] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            sent.append({"passed": scope["type"]})
            return
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b'{"detail": "gone"}'})

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> Any:
        return {"type": "http.disconnect"}

    middleware = OpenAIErrors(inner)
    asyncio.run(middleware({"type": "lifespan"}, receive, send))
    asyncio.run(middleware({"type": "http", "path": "/v1/jobs/x"}, receive, send))
    asyncio.run(middleware({"type": "http", "path": "/v1/fine_tuning/jobs/x"}, receive, send))
    assert sent[0] == {"passed": "lifespan"}
    assert sent[2]["body"] == b'{"detail": "gone"}'  # a native path: as it was
    assert json.loads(sent[4]["body"])["error"]["message"] == "gone"
    assert (b"x-should-retry", b"false") in sent[3]["headers"]


def test_a_client_that_is_not_the_sdk_gets_a_new_job_for_each_create(
    settings: Settings,
) -> None:
    """No `x-stainless-retry-count`: nothing to tell a retry from a new call, so no key (an
    Idempotency-Key is how such a client asks for one)."""

    async def work(sdk: AsyncOpenAI) -> None:
        body = {
            "model": "builtin:tiny",
            "training_file": await upload(sdk),
            "method": METHOD,
            "pdppo": SMALL,
        }
        http = sdk._client  # the SDK's own transport to the app, without the SDK's headers
        headers = {"Authorization": f"Bearer {KEYS['alice']}"}
        answers = [
            await http.post("/v1/fine_tuning/jobs", json=body, headers=headers) for _ in range(2)
        ]
        assert [a.status_code for a in answers] == [200, 200]  # OpenAI's create answers 200
        made = [a.json()["id"] for a in answers]
        keyed = {**headers, "Idempotency-Key": "k1"}
        again = [
            (await http.post("/v1/fine_tuning/jobs", json=body, headers=keyed)).json()["id"]
            for _ in range(2)
        ]
        assert len(set(made)) == 2 and len(set(again)) == 1 and again[0] not in made
        other = {**body, "seed": 5}
        reused = await http.post("/v1/fine_tuning/jobs", json=other, headers=keyed)
        assert reused.status_code == 409
        assert reused.json()["error"]["message"] == (
            "Idempotency-Key was already used with a different job spec"
        )

    run(settings, work)


def test_every_openai_route_wants_an_api_key(settings: Settings) -> None:
    async def work(sdk: AsyncOpenAI) -> None:
        with pytest.raises(openai.AuthenticationError):
            await sdk.fine_tuning.alpha.graders.validate(grader=GRADER)  # type: ignore[arg-type]
        with pytest.raises(openai.AuthenticationError):
            await sdk.fine_tuning.alpha.graders.run(grader=GRADER, model_sample="1")  # type: ignore[arg-type]
        with pytest.raises(openai.AuthenticationError):
            await sdk.fine_tuning.jobs.list()

    run(settings, work, api_key="not-a-key-of-anyone")
