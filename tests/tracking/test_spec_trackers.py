"""What a spec and the operator's settings may say about trackers: a spec names them, and only
the operator says where they are and as whom a run reports."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from core.config import TrainConfig
from pdppo.settings import Settings

REFUSAL = (
    "a spec names its trackers only (report_to: [tensorboard, mlflow, wandb]); tracking URIs, "
    "projects and credentials are set by the operator (PDPPO_MLFLOW_TRACKING_URI, "
    "PDPPO_WANDB_PROJECT, PDPPO_WANDB_ENTITY, WANDB_API_KEY), never in a spec"
)


@pytest.mark.parametrize(
    ("train", "named"),
    [
        ({"mlflow_tracking_uri": "http://mlflow:5000"}, "mlflow_tracking_uri"),
        ({"wandb": {"api_key": "k"}}, "wandb"),
        ({"tracking": {"project": "p"}}, "tracking"),
        ({"report_to": ["mlflow://host:5000"]}, "report_to entry 'mlflow://host:5000'"),
        ({"report_to": [{"wandb": {"key": "k"}}]}, "report_to entry \"{'wandb': {'key': 'k'}}\""),
    ],
)
def test_a_spec_that_sets_where_or_as_whom_is_refused(train: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError) as caught:
        TrainConfig.model_validate(train)
    assert f"{named}: {REFUSAL}" in str(caught.value)


def test_report_to_names_each_tracker_once() -> None:
    assert TrainConfig.model_validate({}).report_to == []
    assert TrainConfig.model_validate({"report_to": ["wandb", "mlflow"]}).report_to == [
        "wandb",
        "mlflow",
    ]
    with pytest.raises(ValidationError, match=r"report_to=\['mlflow', 'mlflow'\] names a"):
        TrainConfig.model_validate({"report_to": ["mlflow", "mlflow"]})
    with pytest.raises(ValidationError, match="Input should be 'tensorboard', 'mlflow' or"):
        TrainConfig.model_validate({"report_to": ["neptune"]})


def test_operator_settings_become_the_runs_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDPPO_REPORT_TO", " mlflow, tensorboard ,mlflow")
    monkeypatch.setenv("PDPPO_MLFLOW_TRACKING_URI", "http://mlflow:5000")
    monkeypatch.setenv("PDPPO_WANDB_MODE", "offline")
    monkeypatch.setenv("PDPPO_TRACKING_CLOSE_SECONDS", "3")
    options = Settings().tracking_options("job-1", {"pdppo.job": "job-1"})
    assert options.report_to == ("mlflow", "tensorboard")
    assert options.mlflow_tracking_uri == "http://mlflow:5000"
    assert options.wandb_mode == "offline" and options.close_seconds == 3.0
    assert options.run_name == "job-1" and dict(options.tags) == {"pdppo.job": "job-1"}
    monkeypatch.setenv("PDPPO_REPORT_TO", "mlflow,neptune")
    with pytest.raises(ValidationError, match=r"report_to names \['neptune'\]"):
        Settings()


def test_the_operators_trackers_join_the_specs() -> None:
    pytest.importorskip("tensorboard")  # each tracker's extra is checked as they are joined
    pytest.importorskip("mlflow")
    from core.tracking import TrackingOptions
    from core.training.reporting import tracking_for

    config = TrainConfig.model_validate({"report_to": ["tensorboard"]})
    assert tracking_for(TrainConfig(), None) is None  # nowhere: no reporter, no thread
    joined = tracking_for(config, TrackingOptions(report_to=("mlflow", "tensorboard")))
    assert joined is not None and joined.report_to == ("tensorboard", "mlflow")
