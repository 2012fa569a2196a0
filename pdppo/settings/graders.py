"""The operator's choices about OpenAI graders that do more than compare text (`core.graders.
hosted`): whether `python` graders run and how long their top level may take to load, which model
endpoint `score_model` graders call, and how many graders.run calls the API runs at once.
`pdppo.settings.Settings` inherits these fields (one settings object, read from `PDPPO_*`).

The API reads them to refuse a grader at submission (400); the workers read them again, since
only what a worker allows is ever run: set them the same on both (a worker that lacks them fails
such a job as `invalid_input`, naming the setting)."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

if TYPE_CHECKING:
    from core.graders.options import GraderOptions


class GraderSettings(BaseSettings):
    openai_python_graders: bool = Field(
        default=False,
        description=(
            "run OpenAI `python` graders (a tenant's `grade(sample, item)`) in the workers' "
            "grading server, under task.grader_timeout_seconds; off: refused with a 400. The "
            "grading server is a separate process with a deadline and without the PDPPO_* "
            "variables, not a security sandbox: turn this on only where tenants may run code "
            "as the workers' (and, for graders.run, the API's) user"
        ),
    )
    openai_python_load_seconds: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description=(
            "how long a python grader's top level (the code outside `grade`: imports, tables) "
            "may run when a grading server loads it. One that raises, exits or runs longer "
            "fails its job before training (`invalid_input`, naming the grader) and is a 400 "
            "from graders.run"
        ),
    )
    grader_runs_max_per_tenant: int = Field(
        default=4,
        ge=1,
        le=1000,
        description=(
            "graders.run calls (POST /v1/fine_tuning/alpha/graders/run) of one tenant that one "
            "API process runs at once; a python grader's run starts a process of its own. Past "
            "it: 429 with Retry-After, and other tenants' runs go on"
        ),
    )
    grader_runs_max: int = Field(
        default=16,
        ge=1,
        le=10000,
        description="graders.run calls of all tenants that one API process runs at once (429)",
    )
    score_model_endpoint: str = Field(
        default="",
        description=(
            "base URL of an OpenAI-compatible chat-completions API (`http://host/v1`) that "
            "OpenAI `score_model` graders call, from the workers; empty: they are refused with "
            "a 400. pdppo's own /v1 serves `job:<id>` models (`pdppo sample-worker`)"
        ),
    )
    score_model_api_key: str = Field(
        default="",
        description="sent as `Authorization: Bearer <key>` to the score model endpoint",
    )
    score_model_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        le=600,
        description=(
            "longest wait for one answer of the score model endpoint (each completion is also "
            "bounded by task.grader_timeout_seconds: set that above this)"
        ),
    )

    @field_validator("score_model_endpoint")
    @classmethod
    def _check_endpoint(cls, value: str) -> str:
        value = value.strip()
        if value:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(
                    f"score_model_endpoint {value!r} must be an http(s) URL such as http://host/v1"
                )
        return value

    def grader_options(self) -> GraderOptions:
        """What the graders of a job may do, as `core.graders` takes it.

        Imported here, not at the top: `core` imports torch, which settings readers such as the
        Celery app's configuration should not pay for."""
        from core.graders.options import GraderOptions, ModelEndpoint

        endpoint = (
            ModelEndpoint(
                self.score_model_endpoint,
                self.score_model_api_key,
                self.score_model_timeout_seconds,
            )
            if self.score_model_endpoint
            else None
        )
        return GraderOptions(
            python=self.openai_python_graders,
            score_model=endpoint,
            python_load_seconds=self.openai_python_load_seconds,
        )
