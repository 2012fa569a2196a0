"""The limits the worker gives a job. Wall clock (`workers.job.runner.timeout_seconds`): the spec's
own, else the server's default, never past the server's maximum, and the default for a spec the
worker cannot read (the job process then fails it, naming the error). Memory
(`memory_limit_bytes`): PDPPO_JOB_MEMORY_LIMIT_MB, else 80% of the machine's (README)."""

from __future__ import annotations

import json
import os
from dataclasses import fields

import pytest

from pdppo.settings import Settings
from pdppo.store.jobs.records import JobRecord
from workers.job.runner import memory_limit_bytes, timeout_seconds

SETTINGS = Settings(job_timeout_minutes=30, max_job_timeout_minutes=120)


def _job(spec_json: str) -> JobRecord:
    values = {f.name: None for f in fields(JobRecord)}
    values |= {"id": "j", "tenant": "t", "status": "running", "queue": "cpu", "step": 0}
    return JobRecord(**{**values, "spec_json": spec_json})  # type: ignore[arg-type]


def _spec(timeout_minutes: float | None) -> str:
    resources = {} if timeout_minutes is None else {"timeout_minutes": timeout_minutes}
    return json.dumps({"train": {"steps": 1}, "resources": resources})


@pytest.mark.parametrize(
    ("spec_json", "seconds"),
    [
        (_spec(None), 30 * 60.0),  # the server's default
        (_spec(5), 5 * 60.0),  # the spec's own, below the default
        (_spec(90), 90 * 60.0),  # above the default, within the maximum
        (_spec(500), 120 * 60.0),  # capped at the maximum
        ("{not json", 30 * 60.0),  # unreadable: the default, not a crashed worker
        (json.dumps({"resources": {"timeout_minutes": -1}}), 30 * 60.0),  # invalid value
    ],
)
def test_timeout_is_the_specs_else_the_default_never_past_the_maximum(
    spec_json: str, seconds: float
) -> None:
    assert timeout_seconds(_job(spec_json), SETTINGS) == seconds


def test_memory_limit_is_the_settings_else_80_percent_of_the_machine() -> None:
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert memory_limit_bytes(Settings(job_memory_limit_mb=512)) == 512 * 2**20
    assert memory_limit_bytes(Settings(job_memory_limit_mb=None)) == int(0.8 * machine)
