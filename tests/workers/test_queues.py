"""Queue names (`pdppo.queues`): a job of N devices waits where only a worker of N or more looks,
and the spec refuses a device count its batch cannot split over."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from pdppo.queues import job_queue, parse_queue, queue_device, worker_queues
from pdppo.spec import JobSpec
from tests.support.specs import smoke_spec


def test_one_device_jobs_keep_the_plain_queues() -> None:
    assert job_queue("cpu") == "cpu" and job_queue("gpu", 1) == "gpu"
    assert job_queue("gpu", 4) == "gpu.x4"
    assert parse_queue("gpu.x4") == ("gpu", 4) and parse_queue("cpu") == ("cpu", 1)
    for bad in ("gpu.x1", "gpu.x65", "tpu", "cpu.x", "cpu.4"):
        with pytest.raises(ValueError):
            parse_queue(bad)


def test_device_counts_are_bounded_at_1_and_64_on_both_sides() -> None:
    """The mutation run's survivors (bench/mutation.py, group ranks): 0 and 64 devices."""
    assert job_queue("gpu", 64) == "gpu.x64" and parse_queue("gpu.x64") == ("gpu", 64)
    assert worker_queues(["cpu"], 64)[0] == "cpu.x64" and len(worker_queues(["cpu"], 64)) == 64
    for bad in (0, 65):
        with pytest.raises(ValueError, match="1 to 64"):
            job_queue("cpu", bad)
        with pytest.raises(ValueError, match="1 to 64"):
            worker_queues(["cpu"], bad)
    assert queue_device("gpu.x4") == "gpu" and queue_device("cpu") == "cpu"


def test_a_worker_takes_every_job_that_fits_it_and_none_bigger() -> None:
    assert worker_queues(["gpu"], 1) == ["gpu"]
    assert worker_queues(["gpu"], 4) == ["gpu.x4", "gpu.x3", "gpu.x2", "gpu"]
    assert worker_queues(["gpu", "cpu"], 2) == ["gpu.x2", "gpu", "cpu.x2", "cpu"]
    assert job_queue("gpu", 8) not in worker_queues(["gpu"], 4)


def spec(gpus: int, **rollout: Any) -> dict[str, Any]:
    raw = smoke_spec()
    raw["resources"]["gpus"] = gpus
    raw["train"]["rollout"].update(rollout)
    return raw


def test_the_spec_routes_by_device_count_and_refuses_a_batch_that_does_not_split() -> None:
    assert JobSpec.model_validate(spec(2)).queue == "cpu.x2"
    assert JobSpec.model_validate(spec(1)).queue == "cpu"
    with pytest.raises(ValidationError, match=r"resources.gpus=3: rollout.prompts_per_step=4"):
        JobSpec.model_validate(spec(3))
    assert JobSpec.model_validate(spec(3, prompts_per_step=6)).queue == "cpu.x3"
    with pytest.raises(ValidationError):
        JobSpec.model_validate(spec(0))
