"""Trying a succeeded job's model: the request, the answer, and the round trip to a sample worker
(`workers.sample_app`), shared by `POST /v1/jobs/{id}/completions` and the OpenAI-shaped
`POST /v1/chat/completions`.

Nothing is generated here: the request is published on the `sample` queue and this process
blocks on the reply key (BLPOP) for at most PDPPO_SAMPLE_TIMEOUT_SECONDS, then answers 504. The
tenant's requests in flight are counted in Redis (INCR before, DECR after, whatever happens), so
the limit holds across API processes."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any, Literal

import anyio
import redis.asyncio as aredis
from fastapi import HTTPException, Request
from pydantic import BaseModel, Field, model_validator

from pdppo.settings import Settings
from pdppo.store import AsyncJobStore, JobRecord
from workers.sample_app import ACTIVE_TTL_SECONDS, active_key, publish, reply_key

MAX_STOP = 4


class ChatTurn(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=100_000)


class CompletionRequest(BaseModel):
    """Exactly one of `prompt` (plain text) and `messages` (chat turns, rendered with the
    model's chat template)."""

    prompt: str | None = Field(default=None, max_length=100_000)
    messages: list[ChatTurn] | None = Field(default=None, min_length=1, max_length=64)
    max_tokens: int = Field(default=32, ge=1, description="at most PDPPO_SAMPLE_MAX_TOKENS")
    temperature: float = Field(default=1.0, ge=0, le=2, description="0: greedy")
    top_p: float = Field(default=1.0, gt=0, le=1)
    n: int = Field(default=1, ge=1, description="completions; at most PDPPO_SAMPLE_MAX_N")
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1, description="repeatable draws")
    stop: str | list[str] | None = Field(
        default=None, description=f"up to {MAX_STOP} strings that end a completion"
    )

    @model_validator(mode="after")
    def _one_prompt(self) -> CompletionRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        if isinstance(self.stop, list) and len(self.stop) > MAX_STOP:
            raise ValueError(f"stop: at most {MAX_STOP} strings")
        return self

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionChoice(BaseModel):
    index: int
    text: str
    tokens: int = Field(description="tokens generated")
    finish_reason: Literal["stop", "length"] = Field(
        description="stop: EOS or a stop string; length: max_tokens or the model's context"
    )


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionTimings(BaseModel):
    load_ms: float = Field(description="loading the model (about 0 when the worker had it)")
    generate_ms: float
    total_ms: float = Field(description="the whole request, as the API saw it")


class CompletionResponse(BaseModel):
    id: str
    job_id: str
    model: str = Field(description="job:<id>")
    cold: bool = Field(description="the worker loaded the model for this request")
    choices: list[CompletionChoice]
    usage: CompletionUsage
    timings: CompletionTimings


def check_limits(body: CompletionRequest, settings: Settings) -> None:
    """422 for what the operator's limits refuse (the schema cannot know them)."""
    if body.max_tokens > settings.sample_max_tokens:
        raise HTTPException(
            422,
            detail=f"max_tokens: at most {settings.sample_max_tokens} (PDPPO_SAMPLE_MAX_TOKENS)",
        )
    if body.n > settings.sample_max_n:
        raise HTTPException(422, detail=f"n: at most {settings.sample_max_n} (PDPPO_SAMPLE_MAX_N)")


def check_model(job: JobRecord, artifact_dir: Path) -> None:
    """409 until the job has succeeded, 404 when its final model is gone from the store."""
    if job.status != "succeeded":
        raise HTTPException(
            409,
            detail=f"job {job.id!r} is {job.status}: only a succeeded job has a model to try",
        )
    if not (artifact_dir / job.id / "final").is_dir():
        raise HTTPException(404, detail=f"job {job.id!r} has no final model in the artifact store")


def blocking_client(settings: Settings) -> aredis.Redis:
    """The API's client for BLPOP on reply keys: its socket timeout outlasts the longest wait
    (the request pool's would call a waiting reply a stalled Redis)."""
    return aredis.Redis.from_url(
        settings.redis_url,
        decode_responses=True,
        socket_timeout=settings.sample_timeout_seconds + 10,
        socket_connect_timeout=settings.redis_connect_timeout_seconds,
    )


async def run_completion(
    request: Request,
    store: AsyncJobStore,
    settings: Settings,
    job: JobRecord,
    body: CompletionRequest,
) -> CompletionResponse:
    """The completions of `body` by `job`'s model (a job of the caller's: the route's lookup
    already said 404 to anyone else)."""
    tenant = job.tenant
    check_limits(body, settings)
    check_model(job, Path(settings.artifact_dir))
    started = time.monotonic()
    key = active_key(tenant)
    active = await store.redis.incr(key)
    try:
        await store.redis.expire(key, ACTIVE_TTL_SECONDS)
        if active > settings.sample_max_concurrent_per_tenant:
            raise HTTPException(
                429,
                detail=f"{active - 1} completion requests of yours are in flight; at most "
                f"{settings.sample_max_concurrent_per_tenant} at once "
                "(PDPPO_SAMPLE_MAX_CONCURRENT_PER_TENANT)",
            )
        reply = await _round_trip(request.app.state.sample_redis, settings, job, body)
    finally:
        await store.redis.decr(key)
    if reply["status"] != 200:
        raise HTTPException(int(reply["status"]), detail=str(reply["detail"]))
    result: dict[str, Any] = reply["result"]
    usage = CompletionUsage(
        prompt_tokens=result["prompt_tokens"],
        completion_tokens=result["completion_tokens"],
        total_tokens=result["prompt_tokens"] + result["completion_tokens"],
    )
    return CompletionResponse(
        id=reply["id"],
        job_id=job.id,
        model=f"job:{job.id}",
        cold=result["cold"],
        choices=[CompletionChoice(index=i, **c) for i, c in enumerate(result["choices"])],
        usage=usage,
        timings=CompletionTimings(
            load_ms=result["load_ms"],
            generate_ms=result["generate_ms"],
            total_ms=round((time.monotonic() - started) * 1000, 3),
        ),
    )


async def _round_trip(
    blocking: aredis.Redis, settings: Settings, job: JobRecord, body: CompletionRequest
) -> dict[str, Any]:
    request_id = f"cmpl-{uuid.uuid4().hex}"
    timeout = settings.sample_timeout_seconds
    request = {
        "id": request_id,
        "job_id": job.id,
        "prompt": body.prompt,
        "messages": [m.model_dump() for m in body.messages] if body.messages else None,
        "max_tokens": body.max_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "n": body.n,
        "seed": body.seed,
        "stop": body.stops(),
        "deadline": time.time() + timeout,
    }
    await anyio.to_thread.run_sync(publish, request)
    popped = await blocking.blpop([reply_key(request_id)], timeout=timeout)
    if popped is None:
        raise HTTPException(
            504,
            detail=f"no sample worker answered within {timeout:g} s "
            "(PDPPO_SAMPLE_TIMEOUT_SECONDS): the workers are busy, or none runs "
            "(`pdppo sample-worker`)",
        )
    reply: dict[str, Any] = json.loads(popped[1])
    reply["id"] = request_id
    return reply
