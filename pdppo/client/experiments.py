"""The client's experiment methods (`/v1/experiments`), mixed into `pdppo.client.Client`.

Creating one is retried through store stalls like `submit`, under an Idempotency-Key the client
makes if the caller gives none: the server then finds the experiment (and every child it made)
instead of making a second. The report is the server's JSON as a dict (its shape:
`core.experiments.report`), or its CSV as text.
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    import httpx

ENDED = frozenset({"succeeded", "failed", "cancelled", "partial"})


class ExperimentRun(BaseModel):
    model_config = ConfigDict(extra="allow")

    seed: int
    job_id: str
    status: str
    progress: dict[str, int] = Field(default_factory=dict)


class ExperimentArm(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    overrides: dict[str, Any] = Field(default_factory=dict)
    runs: builtins.list[ExperimentRun] = Field(default_factory=builtins.list)


class Experiment(BaseModel):
    """An experiment and its children; unknown fields are kept, not rejected."""

    model_config = ConfigDict(extra="allow")

    id: str
    name: str | None = None
    status: str
    created_at: datetime | None = None
    spec: dict[str, Any] = Field(default_factory=dict)
    baseline: str
    arms: builtins.list[ExperimentArm] = Field(default_factory=builtins.list)
    counts: dict[str, int] = Field(default_factory=dict)

    @property
    def ended(self) -> bool:
        return self.status in ENDED


class ExperimentPage(BaseModel):
    items: builtins.list[Experiment]
    next_cursor: str | None = None


class ExperimentsMixin:
    """Experiment methods of `Client`: it supplies `_request` and `_write`."""

    if TYPE_CHECKING:

        def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response: ...

        def _write(self, method: str, path: str, **kwargs: Any) -> httpx.Response: ...

    def create_experiment(
        self, spec: Mapping[str, Any], idempotency_key: str | None = None
    ) -> Experiment:
        """Creates the experiment (`spec`: {name?, base, grid, seeds, baseline?}) and queues its
        children. `ApiError` 422 names the arm and seed of a child the server refuses (none is
        created then), 429 when the children would pass the tenant's active-job limit."""
        key = idempotency_key or f"pdppo-{uuid.uuid4().hex}"
        response = self._write(
            "POST",
            "/v1/experiments",
            json=dict(spec),
            headers={"Idempotency-Key": key},
            hint=f"; the same spec with Idempotency-Key {key} returns it, never a second",
        )
        return Experiment.model_validate(response.json())

    def get_experiment(self, experiment_id: str) -> Experiment:
        answer = self._request("GET", f"/v1/experiments/{experiment_id}")
        return Experiment.model_validate(answer.json())

    def list_experiments(self, limit: int = 20, cursor: str | None = None) -> ExperimentPage:
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        answer = self._request("GET", "/v1/experiments", params=params)
        return ExperimentPage.model_validate(answer.json())

    def iter_experiments(self, page_size: int = 50) -> Iterator[Experiment]:
        cursor: str | None = None
        while True:
            page = self.list_experiments(limit=page_size, cursor=cursor)
            yield from page.items
            if not page.next_cursor or not page.items:
                return
            cursor = page.next_cursor

    def _act(self, experiment_id: str, action: str) -> Experiment:
        answer = self._write("POST", f"/v1/experiments/{experiment_id}/{action}")
        return Experiment.model_validate(answer.json())

    def cancel_experiment(self, experiment_id: str) -> Experiment:
        """Cancels every child not ended yet (running ones stop within seconds)."""
        return self._act(experiment_id, "cancel")

    def pause_experiment(self, experiment_id: str) -> Experiment:
        return self._act(experiment_id, "pause")

    def resume_experiment(self, experiment_id: str) -> Experiment:
        return self._act(experiment_id, "resume")

    def delete_experiment(self, experiment_id: str) -> None:
        """Deletes the experiment and every child; refused (409) while any has not ended."""
        self._request("DELETE", f"/v1/experiments/{experiment_id}")

    def _report_params(
        self,
        metric: str,
        baseline: str | None,
        threshold: float | None,
        final_fraction: float | None,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"metric": metric}
        if baseline is not None:
            params["baseline"] = baseline
        if threshold is not None:
            params["threshold"] = threshold
        if final_fraction is not None:
            params["final_fraction"] = final_fraction
        return params

    def experiment_report(
        self,
        experiment_id: str,
        metric: str = "reward_mean",
        baseline: str | None = None,
        threshold: float | None = None,
        final_fraction: float | None = None,
    ) -> dict[str, Any]:
        """Each arm against the baseline, seed by seed, from the children's metrics so far."""
        params = self._report_params(metric, baseline, threshold, final_fraction)
        answer = self._request("GET", f"/v1/experiments/{experiment_id}/report", params=params)
        report: dict[str, Any] = answer.json()
        return report

    def experiment_report_csv(
        self,
        experiment_id: str,
        metric: str = "reward_mean",
        baseline: str | None = None,
        threshold: float | None = None,
        final_fraction: float | None = None,
    ) -> str:
        params = self._report_params(metric, baseline, threshold, final_fraction)
        params["format"] = "csv"
        answer = self._request("GET", f"/v1/experiments/{experiment_id}/report", params=params)
        return answer.text

    def experiment_curves(
        self, experiment_id: str, metric: str = "reward_mean"
    ) -> dict[str, dict[str, builtins.list[float]]]:
        """Per arm: step, median, low, high of `metric` over seeds."""
        answer = self._request(
            "GET", f"/v1/experiments/{experiment_id}/curves", params={"metric": metric}
        )
        arms: dict[str, dict[str, builtins.list[float]]] = answer.json()["arms"]
        return arms
