"""MLflow: a run per pdppo run, through `mlflow.MlflowClient` (the `mlflow` extra; the client
alone, `mlflow-skinny`, is enough: the server is the operator's).

The client is used directly rather than `mlflow.start_run`'s active run, which is global to the
process and would tie reporting to one thread. A resumed run continues the same MLflow run (as
`start_run(run_id=...)` would): its id comes from the run's `tracking.json`. MLflow's own HTTP
retries are turned off (a down server would hold the channel's thread for minutes per call): the
channel retries, with its own bounded backoff. Samples and tagged events (steering changes,
checkpoints) are JSON artifacts of the run (`samples/`, `events/`); checkpoints are recorded by
step and path, not uploaded (a model's weights stay in the job's folder)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from core.tracking.base import Tracker, TrackerRun

PARAM_CHARS = 6000  # MLflow's longest parameter value
PARAMS_PER_BATCH = 100
METRICS_PER_BATCH = 1000


class MlflowTracker(Tracker):
    name = "mlflow"

    def open(self, previous: TrackerRun | None, resume_step: int | None) -> TrackerRun:
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        from mlflow import MlflowClient

        uri = self.options.mlflow_tracking_uri
        self._stamps: dict[int, int] = {}
        self.client = MlflowClient(tracking_uri=uri)
        if previous is not None:
            run = self.client.get_run(previous.run_id)
            self.client.update_run(previous.run_id, status="RUNNING")
            delivered = self._taken(run, previous.delivered)
        else:
            run = self.client.create_run(
                self._experiment(), run_name=self.options.run_name, tags=dict(self.options.tags)
            )
            delivered = {}
        self.run_id = run.info.run_id
        url = None
        if uri and uri.startswith(("http://", "https://")):
            url = f"{uri.rstrip('/')}/#/experiments/{run.info.experiment_id}/runs/{self.run_id}"
        return TrackerRun(self.name, run_id=self.run_id, url=url, delivered=delivered)

    def _taken(self, run: Any, saved: Mapping[str, int]) -> dict[str, int]:
        """What the run holds: `saved` (`tracking.json`), or further where the server has more
        (a request that reached it while the run was killed before it heard back). A request
        holds whole steps and MLflow stores it at once, so the latest step of any of a kind's
        metrics is that kind's."""
        delivered = dict(saved)
        for kind, prefix in (("step", "train/"), ("eval", "eval/")):
            key = next((k for k in run.data.metrics if k.startswith(prefix)), None)
            if key is not None:
                history = self.client.get_metric_history(run.info.run_id, key)
                latest = max((m.step for m in history), default=-1)
                delivered[kind] = max(delivered.get(kind, -1), latest)
        return delivered

    def _experiment(self) -> str:
        name = self.options.mlflow_experiment
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(self.client.create_experiment(name))
        except Exception:  # another run created it meanwhile
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return str(found.experiment_id)

    def metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.metrics_many([(step, metrics)])

    def metrics_many(self, items: Sequence[tuple[int, Mapping[str, float]]]) -> None:
        """One request for up to `METRICS_PER_BATCH` numbers, whatever their steps."""
        from mlflow.entities import Metric

        # a step's timestamp is its first try's: a retry after a lost reply sends the same rows,
        # which MLflow's store takes once (its key is run, name, step, timestamp and value)
        now = int(time.time() * 1000)
        stamps = [self._stamps.setdefault(step, now) for step, _ in items]
        # whole steps per request (`_taken` relies on it), as many as MLflow takes at once
        batch: list[Metric] = []
        for (step, metrics), stamp in zip(items, stamps, strict=True):
            rows = [Metric(k, v, stamp, step) for k, v in metrics.items()]
            if batch and len(batch) + len(rows) > METRICS_PER_BATCH:
                self.client.log_batch(self.run_id, metrics=batch)
                batch = []
            batch.extend(rows)
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def table(self, step: int, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        rows_json = {"step": step, "rows": [dict(row) for row in rows]}
        self.client.log_dict(self.run_id, rows_json, f"{name}/{step:08d}.json")

    def config(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(key, str(value)[:PARAM_CHARS]) for key, value in config.items()]
        for i in range(0, len(params), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=params[i : i + PARAMS_PER_BATCH])

    def event(self, step: int, tag: str, data: Mapping[str, Any]) -> None:
        self.client.log_dict(self.run_id, dict(data), f"events/{step:08d}-{tag}.json")
        self.client.set_tag(self.run_id, f"pdppo.{tag}", str(dict(data))[:PARAM_CHARS])

    def close(self) -> None:
        self.client.set_terminated(self.run_id, "FINISHED")
