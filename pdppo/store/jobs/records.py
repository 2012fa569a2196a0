"""The job hash decoded into typed values, and what a create returns.

The stores read and write raw Redis hashes; everything above them (the API's schemas, the
workers) deals in these frozen records instead, so the decoding rules (defaults for fields an
older record lacks, JSON-encoded metrics and spec) live in one place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, cast

from core.training.steering import merge_patch

TERMINAL = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class JobRecord:
    """The job hash, decoded; `api.schemas.Job` is its public face."""

    id: str
    tenant: str
    status: str
    queue: str
    name: str | None
    spec_json: str
    spec_digest: str
    created_at: str
    updated_at: str
    started_at: str | None
    finished_at: str | None
    step: int
    total_steps: int
    metrics: dict[str, float] | None
    error_code: str | None
    error_message: str | None
    error_traceback: str | None
    cancel_requested: bool
    pause_requested: bool
    config_version: int  # the steering change applied last (0: none), `pdppo.store.jobs.steering`
    overrides: dict[str, Any]  # the cumulative change, a merge patch of the spec
    attempts: int
    final_model: str | None
    # what the job is doing ({name, done, total}, `core.training.callbacks.PHASES`), as its run last
    # said
    phase: dict[str, Any] | None = None
    # what a finished run learned nothing from ([{code, message}],
    # `core.training.silence.run_warnings`)
    warnings: tuple[dict[str, str], ...] = ()
    # the `POST /v1/fine_tuning/jobs` request that made it, as given (`api.openai`): what its
    # OpenAI view shows (metadata, suffix, hyperparameters, the grader); None for a native job
    openai: dict[str, Any] | None = None
    # the experiment-tracker runs it reports to ({tracker: {run_id, url}}, `core.tracking`)
    trackers: dict[str, dict[str, str]] | None = None
    # the experiment it is a child of (`pdppo.store.experiments`): a flow of its own in the fair
    # order (`pdppo.store.jobs.fair`)
    experiment: str | None = None

    @classmethod
    def from_hash(cls, raw: dict[str, str]) -> JobRecord:
        metrics = raw.get("metrics")
        return cls(
            id=raw["id"],
            tenant=raw["tenant"],
            status=raw["status"],
            queue=raw.get("queue", "cpu"),
            name=raw.get("name") or None,
            spec_json=raw["spec"],
            spec_digest=raw.get("spec_digest", ""),
            created_at=raw["created_at"],
            updated_at=raw.get("updated_at", raw["created_at"]),
            started_at=raw.get("started_at"),
            finished_at=raw.get("finished_at"),
            step=int(raw.get("step", 0)),
            total_steps=int(raw.get("total_steps", 0)),
            metrics=json.loads(metrics) if metrics else None,
            error_code=raw.get("error_code"),
            error_message=raw.get("error_message"),
            error_traceback=raw.get("error_traceback"),
            cancel_requested=raw.get("cancel_requested") == "1",
            pause_requested=raw.get("pause_requested") == "1",
            config_version=int(raw.get("config_version", 0)),
            overrides=json.loads(raw.get("overrides") or "{}"),
            attempts=int(raw.get("attempts", 0)),
            final_model=raw.get("final_model"),
            phase=json.loads(raw["phase"]) if raw.get("phase") else None,
            warnings=tuple(json.loads(raw.get("warnings") or "[]")),
            openai=json.loads(raw["openai"]) if raw.get("openai") else None,
            trackers=json.loads(raw["trackers"]) if raw.get("trackers") else None,
            experiment=raw.get("experiment") or None,
        )

    @property
    def spec(self) -> dict[str, Any]:
        """The spec as submitted."""
        return cast(dict[str, Any], json.loads(self.spec_json))

    @property
    def current_spec(self) -> dict[str, Any]:
        """The spec with the changes made while it ran (`overrides`): what it runs with now."""
        return cast(dict[str, Any], merge_patch(self.spec, self.overrides))

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True)
class CreateResult:
    outcome: str  # "created", "existing" (idempotent replay) or "limit"
    job_id: str | None
    active: int = 0
    record: JobRecord | None = None  # the new job, when created


def record_or_none(raw: dict[str, str]) -> JobRecord | None:
    """None for an empty hash: the job is gone (or never was)."""
    return JobRecord.from_hash(raw) if raw else None
