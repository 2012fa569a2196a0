"""The client's completions method (`POST /v1/jobs/{id}/completions`: trying a succeeded job's
model), mixed into `pdppo.client.Client`, apart from `pdppo.client` so that each module stays
about one resource."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    import httpx

# The server answers 504 after PDPPO_SAMPLE_TIMEOUT_SECONDS (60 by default, 600 at most): the
# client waits a little longer, so that it hears the server's 504 rather than its own timeout.
READ_TIMEOUT_SECONDS = 620.0


class CompletionChoice(BaseModel):
    model_config = ConfigDict(extra="allow")

    index: int
    text: str
    tokens: int
    finish_reason: str


class CompletionUsage(BaseModel):
    model_config = ConfigDict(extra="allow")

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Completion(BaseModel):
    """The server's answer; unknown fields are kept, not rejected. `timings` in milliseconds
    (`load_ms`, `generate_ms`, `total_ms`); `cold`: the worker loaded the model for it."""

    model_config = ConfigDict(extra="allow")

    id: str
    job_id: str
    model: str
    cold: bool
    choices: list[CompletionChoice]
    usage: CompletionUsage
    timings: dict[str, float]


class SamplingMixin:
    """Completions of `Client`: it supplies `_request`."""

    if TYPE_CHECKING:

        def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response: ...

    def complete(
        self,
        job_id: str,
        prompt: str | None = None,
        *,
        messages: Sequence[Mapping[str, str]] | None = None,
        max_tokens: int = 32,
        temperature: float = 1.0,
        top_p: float = 1.0,
        n: int = 1,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
    ) -> Completion:
        """Completions of `prompt` (or of chat turns, `messages`) by the job's final model, on a
        sample worker. `ApiError` 409 until the job has succeeded, 429 when the tenant has its
        limit of requests in flight, 504 when no sample worker answered in time."""
        body: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "n": n,
        }
        if prompt is not None:
            body["prompt"] = prompt
        if messages is not None:
            body["messages"] = [dict(m) for m in messages]
        if seed is not None:
            body["seed"] = seed
        if stop is not None:
            body["stop"] = stop if isinstance(stop, str) else list(stop)
        response = self._request(
            "POST",
            f"/v1/jobs/{job_id}/completions",
            json=body,
            timeout=READ_TIMEOUT_SECONDS,
        )
        return Completion.model_validate(response.json())
