"""The JSON shapes of `/v1/experiments` (the request body is `core.experiments.ExperimentSpec`).

The report's shape is `core.experiments.report`'s, written out here so that the OpenAPI schema
(and the contract tests that hold responses to it) say what each number is.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from api.schemas import JobStatus, Progress

ExperimentStatus = Literal[
    "queued", "running", "paused", "succeeded", "failed", "cancelled", "partial"
]


class ExperimentRun(BaseModel):
    """One (arm, seed): the child job that runs it."""

    seed: int
    job_id: str
    status: JobStatus
    progress: Progress


class ExperimentArm(BaseModel):
    name: str = Field(description="each axis's last path segment=value, joined by ','")
    overrides: dict[str, Any] = Field(description="spec path under train -> the arm's value")
    runs: list[ExperimentRun] = Field(description="one per seed, in seed order")


class Experiment(BaseModel):
    """An experiment as `POST /v1/experiments` and `GET /v1/experiments/{id}` return it."""

    id: str
    name: str | None = None
    status: ExperimentStatus = Field(
        description=(
            "running while any child runs, else queued while any waits, else paused while any "
            "is paused; once all ended: succeeded, failed or cancelled when all ended so, else "
            "partial"
        )
    )
    created_at: datetime
    spec: dict[str, Any] = Field(description="the ExperimentSpec as submitted")
    baseline: str = Field(description="the arm the report compares the others with by default")
    arms: list[ExperimentArm]
    counts: dict[str, int] = Field(description="child jobs by status")


class ExperimentList(BaseModel):
    """`GET /v1/experiments`: own experiments, newest first."""

    items: list[Experiment]
    next_cursor: str | None = None


class FinalSummary(BaseModel):
    median: float | None
    min: float | None
    max: float | None
    per_seed: dict[str, float] = Field(description="seed -> the mean of the metric at the end")


class StepsToThreshold(BaseModel):
    reached: int = Field(description="seeds whose 5-step running mean reached the threshold")
    of: int
    median: int | None = Field(description="the lower median step of the seeds that reached it")
    per_seed: dict[str, int | None]


class MaskedFraction(BaseModel):
    mean: float | None
    per_seed: dict[str, float | None]


class SignTest(BaseModel):
    wins: int
    losses: int
    ties: int
    p_value: float | None = Field(
        description="exact two-sided binomial test; null with no wins/losses"
    )


class DiffInterval(BaseModel):
    mean_diff: float | None
    ci95: list[float] | None = Field(description="bootstrap 95% interval (percentile), paired")


class VsBaseline(DiffInterval):
    per_seed: dict[str, float] = Field(description="seed -> this arm's final minus the baseline's")
    sign_test: SignTest
    masked_fraction_diff: DiffInterval | None = None
    note: str | None = Field(
        default=None,
        description=(
            "why the comparison says nothing, when the arm tied the baseline on every paired "
            "seed (e.g. no mask fired in either arm: on-policy rollouts); null otherwise"
        ),
    )


class ArmReport(BaseModel):
    name: str
    seeds: list[int]
    final: FinalSummary
    steps_to_threshold: StepsToThreshold | None = Field(description="null without a threshold")
    masked_fraction: MaskedFraction
    vs_baseline: VsBaseline | None = Field(description="null for the baseline arm")


class ExperimentReport(BaseModel):
    """`GET /v1/experiments/{id}/report`: each arm against the baseline, seed by seed."""

    metric: str
    baseline: str
    threshold: float | None
    final_fraction: float
    resamples: int
    paired_seeds: list[int] = Field(description="the seeds every arm has metrics for")
    arms: list[ArmReport]


class ArmCurve(BaseModel):
    step: list[float]
    median: list[float]
    low: list[float] = Field(description="the minimum over seeds at each step")
    high: list[float] = Field(description="the maximum over seeds at each step")


class ExperimentCurves(BaseModel):
    """`GET /v1/experiments/{id}/curves`: per arm, the metric's median and range over seeds."""

    metric: str
    arms: dict[str, ArmCurve]
