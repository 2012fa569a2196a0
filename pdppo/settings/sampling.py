"""The operator's limits on trying a tuned model from the service (`POST /v1/jobs/{id}/completions`,
`POST /v1/chat/completions`, run by `pdppo sample-worker`). `pdppo.settings.Settings` inherits
these fields (one settings object, read from `PDPPO_*`).

Why limits at all: a completion holds a sample worker's thread for as long as it generates, and
the service is for trying a model, not for serving traffic (that is `vllm serve <final dir>`);
so a tenant gets a few short generations at a time, and a request that waits longer than
PDPPO_SAMPLE_TIMEOUT_SECONDS is answered 504 rather than held open."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings


class SamplingSettings(BaseSettings):
    sample_max_tokens: int = Field(
        default=256, ge=1, le=8192, description="the most tokens one completion may generate"
    )
    sample_max_prompt_tokens: int = Field(
        default=2048,
        ge=1,
        le=131072,
        description="the longest prompt a completion accepts, in tokens",
    )
    sample_max_n: int = Field(
        default=4, ge=1, le=64, description="the most completions one request may ask for (`n`)"
    )
    sample_max_concurrent_per_tenant: int = Field(
        default=2,
        ge=1,
        le=1000,
        description="completion requests a tenant may have in flight at once (more: 429)",
    )
    sample_timeout_seconds: float = Field(
        default=60,
        gt=0,
        le=600,
        description=(
            "how long a completion request waits for a sample worker's answer (queue and "
            "generation) before it is answered 504"
        ),
    )
    sample_models_cached: int = Field(
        default=2, ge=1, le=64, description="models a sample worker keeps loaded (least recent out)"
    )
    sample_concurrency: int = Field(
        default=2, ge=1, le=64, description="completions a sample worker runs at once (threads)"
    )
