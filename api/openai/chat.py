"""`POST /v1/chat/completions`, OpenAI's shape: `model` is a succeeded job's `fine_tuned_model`
(`job:<id>`, or `ftjob-<id>`), answered by a sample worker as `POST /v1/jobs/{id}/completions`
answers (`api.completions`). Errors are OpenAI's error object (`api.openai.errors`)."""

from __future__ import annotations

import time
from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, Field

from api.completions import ChatTurn, CompletionRequest, run_completion
from api.deps import SettingsDep, StoreDep, TenantDep, get_owned_job
from api.openai.schemas import OpenAIErrorBody
from api.openai.translate import job_id_of

router = APIRouter(prefix="/v1/chat", tags=["openai"])
_ERROR: dict[str, Any] = {"model": OpenAIErrorBody}


class ChatCompletionCreate(BaseModel):
    model: str = Field(max_length=80, description="the job's fine_tuned_model: job:<id>")
    messages: list[ChatTurn] = Field(min_length=1, max_length=64)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, description="as max_tokens")
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    n: int = Field(default=1, ge=1)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = None


class ChatMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ChatMessage
    finish_reason: Literal["stop", "length"]
    logprobs: None = None


class ChatUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: ChatUsage


@router.post(
    "/completions",
    response_model=ChatCompletion,
    responses={
        400: {
            **_ERROR,
            "description": "the prompt is too long, a limit is passed, or the "
            "model's chat template refuses the turns",
        },
        404: {
            **_ERROR,
            "description": "`model` names no succeeded job of yours with a final "
            "model (another tenant's is indistinguishable)",
        },
        409: {**_ERROR, "description": "the job has not succeeded (no model to try)"},
        429: {
            **_ERROR,
            "description": "PDPPO_SAMPLE_MAX_CONCURRENT_PER_TENANT requests of "
            "this tenant are in flight",
        },
        504: {
            **_ERROR,
            "description": "no sample worker answered within PDPPO_SAMPLE_TIMEOUT_SECONDS",
        },
    },
)
async def create_chat_completion(
    request: Request,
    body: ChatCompletionCreate,
    tenant: TenantDep,
    store: StoreDep,
    settings: SettingsDep,
) -> ChatCompletion:
    """A chat completion by a tuned model, as OpenAI's `client.chat.completions.create` asks."""
    if not body.model.startswith(("job:", "ftjob-")):
        raise HTTPException(
            404,
            detail=f"model: {body.model!r} is not a fine-tuned model of this service (job:<id>)",
        )
    job = await get_owned_job(job_id_of(body.model.removeprefix("job:")), tenant, store)
    native = CompletionRequest(
        messages=body.messages,
        max_tokens=body.max_completion_tokens or body.max_tokens or 32,
        temperature=body.temperature,
        top_p=body.top_p,
        n=body.n,
        seed=body.seed,
        stop=body.stop,
    )
    out = await run_completion(request, store, settings, job, native)
    return ChatCompletion(
        id=f"chatcmpl-{out.id.removeprefix('cmpl-')}",
        created=int(time.time()),
        model=out.model,
        choices=[
            ChatChoice(
                index=c.index, message=ChatMessage(content=c.text), finish_reason=c.finish_reason
            )
            for c in out.choices
        ],
        usage=ChatUsage(**out.usage.model_dump()),
    )
