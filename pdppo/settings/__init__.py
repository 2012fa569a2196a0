"""The one settings object of the service, read from `PDPPO_*` environment variables (and `.env`).

The API, the Celery app and the workers all read this, so a deployment configures everything in
one place. Outside development it refuses the insecure defaults (no API keys, short keys) instead
of starting a service that anyone can use.
"""

from __future__ import annotations

import re
import tempfile
from functools import cached_property, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from pdppo.settings.budgets import BudgetSettings
from pdppo.settings.graders import GraderSettings
from pdppo.settings.http import HttpSettings
from pdppo.settings.sampling import SamplingSettings
from pdppo.settings.storage import StorageSettings
from pdppo.settings.tracking import TrackingSettings
from pdppo.settings.webhooks import MAKE_KEY, WebhookSettings, parse_secret_keys

if TYPE_CHECKING:
    from pdppo.store.webhooks.sealing import SecretBox

_TENANT_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
MIN_PRODUCTION_KEY_LENGTH = 16


def parse_api_keys(raw: str) -> dict[str, str]:
    """Parse `tenant:key,tenant:key` into {key: tenant}; a tenant may hold several keys."""
    by_key: dict[str, str] = {}
    for entry in raw.split(","):
        entry = entry.strip()
        if not entry:
            continue
        tenant, sep, key = entry.partition(":")
        tenant, key = tenant.strip(), key.strip()
        if not sep or not key:
            raise ValueError(f"api_keys entry {entry.split(':')[0]!r} must be 'tenant:key'")
        if not _TENANT_RE.match(tenant):
            raise ValueError(f"api_keys tenant {tenant!r} must match {_TENANT_RE.pattern}")
        if key in by_key and by_key[key] != tenant:
            raise ValueError(f"api_keys: one key is given to both {by_key[key]!r} and {tenant!r}")
        by_key[key] = tenant
    return by_key


def _split_roots(raw: str) -> list[Path]:
    return [Path(part.strip()) for part in raw.split(",") if part.strip()]


def _installed_engines() -> list[Literal["hf", "vllm"]]:
    """hf, and vllm where this process can import it (found without importing: seconds)."""
    import importlib.util

    return ["hf", "vllm"] if importlib.util.find_spec("vllm") is not None else ["hf"]


class Settings(
    BudgetSettings,
    HttpSettings,
    StorageSettings,
    GraderSettings,
    SamplingSettings,
    TrackingSettings,
    WebhookSettings,
):
    """Service settings; every field is the env var `PDPPO_<FIELD NAME IN CAPITALS>`. Those of
    one concern live in a module of their own: job budgets (`pdppo.settings.budgets`), the API
    under load (`.http`), the artifact disk (`.storage`), OpenAI graders (`.graders`), sampling
    (`.sampling`), experiment tracking (`.tracking`) and webhooks (`.webhooks`)."""

    # hide_input_in_errors: a refused setting's error names the variable and why, never the value
    # given (API keys, tokens and webhook secret keys are settings; their errors are logged)
    model_config = SettingsConfigDict(
        env_prefix="PDPPO_", env_file=".env", extra="ignore", hide_input_in_errors=True
    )

    environment: Literal["development", "test", "production"] = Field(
        default="development",
        description=(
            "production refuses empty or short API keys, and no PDPPO_WEBHOOK_SECRET_KEYS"
        ),
    )
    redis_url: str = Field(
        default="redis://localhost:6379/0", description="job store, event streams and Celery broker"
    )
    api_keys: str = Field(
        default="", description="'tenant:key,tenant:key'; a tenant may have several"
    )
    artifact_dir: Path = Field(
        default=Path(".pdppo/artifacts"),
        description="checkpoints and models, one folder per job id",
    )
    max_active_jobs_per_tenant: int = Field(
        default=16,
        ge=1,
        description="queued, running and paused jobs per tenant before POST answers 429",
    )
    max_body_bytes: int = Field(
        default=1_048_576, ge=1024, description="request bodies above get 413"
    )
    sse_ping_seconds: float = Field(
        default=15.0, gt=0, description="keep-alive ping on idle streams"
    )
    sse_queue_size: int = Field(
        default=4096,
        ge=16,
        description="events buffered per slow SSE subscriber before it is dropped",
    )
    lease_seconds: float = Field(
        default=30.0, ge=1, description="a job whose worker stops renewing for this long is resumed"
    )
    visibility_timeout_seconds: int = Field(
        default=3600, ge=10, description="Celery redelivers an unacknowledged task after this"
    )
    max_worker_losses: int = Field(
        default=3,
        ge=0,
        description="a job whose worker died more often than this fails (0: retry forever)",
    )
    idempotency_ttl_seconds: int = Field(
        default=86_400, ge=60, description="Idempotency-Key lifetime"
    )
    max_job_devices: int = Field(
        default=1,
        ge=1,
        le=64,
        description=(
            "most devices (resources.gpus) a job may ask for; set it to the most any worker "
            "declares (PDPPO_WORKER_DEVICES), so that no job waits for a worker that never comes"
        ),
    )
    worker_devices: int = Field(
        default=1,
        ge=1,
        le=64,
        description=(
            "devices this worker owns (`pdppo worker --devices`/`--gpus`): it takes jobs of up to "
            "that many (resources.gpus), one at a time; on the cpu queue a device is a process"
        ),
    )
    worker_heartbeat_dir: Path = Field(
        default=Path(tempfile.gettempdir()) / "pdppo-workers",
        description=(
            "where each worker process (and each webhook worker's scheduler thread) writes when "
            "it last reached Redis; `pdppo healthcheck` (the worker containers' healthcheck) and "
            "the webhooks container's healthcheck read it"
        ),
    )
    worker_health_max_age_seconds: float = Field(
        default=60.0,
        gt=0,
        description=(
            "`pdppo healthcheck` calls a worker dead, and the webhooks container's healthcheck a "
            "webhook scheduler, whose last reach of Redis is older"
        ),
    )
    job_threads: int | None = Field(
        default=None,
        ge=1,
        description=(
            "torch threads of each job process (each rank); default: the worker's cores (its "
            "CPU affinity) divided by the jobs running on them (PDPPO_WORKER_JOBS_AT_ONCE), "
            "then by the job's ranks"
        ),
    )
    worker_torch_threads: int | None = Field(
        default=None,
        ge=1,
        description="the former name of PDPPO_JOB_THREADS, still read when that is unset",
    )
    worker_jobs_at_once: int | None = Field(
        default=None,
        ge=1,
        description=(
            "jobs that run at once on this worker's cores; unset: counted, the jobs running "
            "now on this host's cores (every worker's, kept up to date), as each job's torch "
            "threads are the cores over that count (deploy/gpu-workers.sh sets the count)"
        ),
    )
    rollout_engines: list[Literal["hf", "vllm"]] = Field(
        default_factory=_installed_engines,
        min_length=1,
        description=(
            "rollout engines the workers offer (JSON list); a spec asking for another is a 422. "
            "Default: hf, and vllm where this process can import it (set it on an API whose "
            "image lacks the `vllm` extra that its workers have)"
        ),
    )
    cancel_grace_seconds: float = Field(
        default=5.0,
        gt=0,
        le=600,
        description=(
            "a job asked to stop (cancel, timeout, worker shutdown) that has not stopped by itself "
            "after this long is killed; it then resumes from its last checkpoint"
        ),
    )
    job_timeout_minutes: float = Field(
        default=24 * 60,
        gt=0,
        description="wall-clock limit of a job that sets no resources.timeout_minutes",
    )
    max_job_timeout_minutes: float = Field(
        default=7 * 24 * 60,
        gt=0,
        description="the largest resources.timeout_minutes a spec may ask for (422 above)",
    )
    job_memory_limit_mb: int | None = Field(
        default=None,
        ge=0,
        description=(
            "address-space limit of a CPU job's process (RLIMIT_AS), so a job that runs out of "
            "memory fails as out_of_memory instead of drawing the kernel's OOM killer onto the "
            "worker; unset: 80% of the machine's memory, 0: no limit. Not applied to CUDA jobs, "
            "whose driver reserves far more address space than it uses"
        ),
    )
    log_level: str = Field(default="INFO", description="log level of the API and workers")
    data_roots: str = Field(
        default="",
        description=(
            "comma-separated absolute directories on the workers that job specs may read local "
            "models (hf:/path) and datasets (task.path) from; empty: hub model ids only"
        ),
    )

    # Redis stalls (pdppo.store.retry): a worker retries transient store errors instead of
    # failing the job, and hands the job back only after `store_outage_seconds`.
    redis_socket_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description=(
            "workers' wait for one Redis reply before retrying; no worker command blocks on the "
            "server, so a slower reply means a stalled Redis (a client that uses XREAD BLOCK "
            "needs more than its block time plus latency)"
        ),
    )
    redis_connect_timeout_seconds: float = Field(
        default=5.0, gt=0, le=300, description="workers' wait for a connection to Redis"
    )
    store_outage_seconds: float = Field(
        default=60.0,
        gt=0,
        description=(
            "how long a worker keeps retrying a Redis that does not answer before it gives the "
            "job back (checkpointed, queued again); a running job cannot outlast its lease "
            "(lease_seconds) without Redis either"
        ),
    )

    outbox_grace_seconds: float = Field(
        default=5.0,
        gt=0,
        le=300,
        description=(
            "a job created or queued again whose task is not in the broker this long after is "
            "sent by a worker's dispatcher (its sender died in between); a task a worker took "
            "but did not claim within max(this, lease_seconds) is put back in the queue"
        ),
    )
    api_publish_tasks: bool = Field(
        default=True,
        description=(
            "the API publishes a new job's task right after creating it (from a thread, off the "
            "request path); false leaves every job to the workers' outbox dispatcher, which "
            "sends it PDPPO_OUTBOX_GRACE_SECONDS later (an API that cannot reach the broker)"
        ),
    )
    metrics_token: str = Field(
        default="",
        description=(
            "when set, GET /metrics needs `Authorization: Bearer <this>` (Prometheus: "
            "`authorization: {credentials: ...}`); empty: /metrics is open, as /healthz is"
        ),
    )

    @field_validator("api_keys")
    @classmethod
    def _check_api_keys(cls, value: str) -> str:
        parse_api_keys(value)
        return value

    @model_validator(mode="after")
    def _refuse_insecure_production(self) -> Settings:
        if self.environment == "production":
            keys = self.tenants_by_key
            if not keys:
                raise ValueError("PDPPO_API_KEYS must be set when PDPPO_ENVIRONMENT=production")
            short = sorted({t for k, t in keys.items() if len(k) < MIN_PRODUCTION_KEY_LENGTH})
            if short:
                raise ValueError(
                    f"API keys of tenants {short} are shorter than {MIN_PRODUCTION_KEY_LENGTH} "
                    "characters; refused in production"
                )
            if not self.webhook_secret_keys.get_secret_value().strip():
                raise ValueError(
                    "PDPPO_WEBHOOK_SECRET_KEYS must be set when PDPPO_ENVIRONMENT=production: "
                    f"the key webhook signing secrets are encrypted with (make one with {MAKE_KEY})"
                )
        return self

    def webhook_secrets(self) -> SecretBox:
        """What seals and opens webhook signing secrets (`pdppo.store.webhooks.sealing`): with
        PDPPO_WEBHOOK_SECRET_KEYS, or (development) the key generated in the artifact folder."""
        from pdppo.store.webhooks.sealing import generated_key, secret_box

        keys = parse_secret_keys(self.webhook_secret_keys.get_secret_value())
        return secret_box(tuple(keys) or (generated_key(self.artifact_dir),))

    @field_validator("data_roots")
    @classmethod
    def _check_data_roots(cls, value: str) -> str:
        for root in _split_roots(value):
            if not root.is_absolute():
                raise ValueError(f"data_roots entry {str(root)!r} must be an absolute path")
        return value

    @property
    def allowed_data_roots(self) -> list[Path]:
        return _split_roots(self.data_roots)

    @cached_property
    def tenants_by_key(self) -> dict[str, str]:
        return parse_api_keys(self.api_keys)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
