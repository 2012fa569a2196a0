"""The experiment-tracker runs a job reports to, on its dashboard page: a link to the MLflow
run's page, TensorBoard's folder as text (it has no page of its own). Needs the `trackers`
extra and an MLflow server (tests/support/mlflow.py); skipped without them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.browser.dashboard import login
from tests.support.mlflow import MlflowServer
from tests.support.specs import smoke_spec
from tests.support.stack import KEYS, Service
from tests.support.waits import wait_for

pytest.importorskip("tensorboard")
pytest.importorskip("mlflow")
TIMEOUT_MS = 60_000


def test_the_job_page_links_its_tracker_runs(
    page: Any, make_service: Callable[..., Service], mlflow_server: MlflowServer
) -> None:
    svc = make_service(PDPPO_MLFLOW_TRACKING_URI=mlflow_server.url)
    svc.start_api()
    svc.start_worker("cpu")
    with httpx.Client(
        base_url=svc.base_url, headers={"Authorization": f"Bearer {KEYS['alice']}"}
    ) as alice:
        spec = smoke_spec(steps=4, report_to=["tensorboard", "mlflow"])
        job_id = alice.post("/v1/jobs", json=spec).json()["id"]
        job = wait_for(alice, job_id, lambda j: j["status"] == "succeeded", timeout=120)
    login(page, svc.base_url, KEYS["alice"])
    page.wait_for_selector("#spec")
    page.goto(f"{svc.base_url}/ui/#/jobs/{job_id}")
    link = page.wait_for_selector("#job-trackers [data-tracker=mlflow] a", timeout=TIMEOUT_MS)
    assert link.get_attribute("href") == job["trackers"]["mlflow"]["url"]
    assert link.inner_text() == "mlflow: open run"
    folder = job["trackers"]["tensorboard"]["run_id"]
    shown = page.inner_text("#job-trackers [data-tracker=tensorboard]")
    assert shown.strip() == f"tensorboard: {folder}"
