"""`Client.delete_job`, `Client.usage`, `pdppo delete` and `pdppo usage` against the real stack
(tenant carol, the client tests' own service)."""

from __future__ import annotations

import json
import re
import time

import pytest
from click.testing import CliRunner

from pdppo.cli import main
from pdppo.client import ApiError, Client
from tests.client.jobs import TENANT
from tests.support.specs import parked_spec


def _run(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, args, env=env, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_client_deletes_an_ended_job_and_reports_usage(client: Client) -> None:
    job = client.submit(parked_spec("to-delete"))
    with pytest.raises(ApiError) as active:
        client.delete_job(job.id)
    assert active.value.status_code == 409
    assert f"job {job.id!r} is queued; only an ended job can be deleted" in str(active.value)
    before = client.usage()
    assert before.tenant == TENANT and before.quota_bytes is None
    assert before.jobs["queued"] >= 1

    client.cancel(job.id)
    client.delete_job(job.id)
    with pytest.raises(ApiError) as gone:
        client.get(job.id)
    assert gone.value.status_code == 404
    after = client.usage()
    # The total, not each status: an earlier test's job may end its cancel meanwhile (running
    # to cancelled), while no job is created between the two readings.
    assert sum(after.jobs.values()) == sum(before.jobs.values()) - 1  # deleted, not counted


def test_delete_and_usage_commands(client: Client, cli_env: dict[str, str]) -> None:
    job = client.submit(parked_spec("cli-delete"))
    code, _, err = _run(["delete", job.id], cli_env)
    assert code == 2 and "HTTP 409" in err and "cancel it first" in err
    assert len(err.strip().splitlines()) == 1
    client.cancel(job.id)
    code, out, err = _run(["delete", job.id], cli_env)
    assert (code, out) == (0, f"{job.id} deleted\n"), err
    code, _, err = _run(["delete", job.id], cli_env)
    assert code == 2 and "HTTP 404" in err

    # An earlier test's job may end its cancel (running to cancelled) at any moment: compare the
    # command's counts with the API's read just before and just after it, the same both times.
    for _ in range(50):
        usage = client.usage()
        code, out, err = _run(["usage"], cli_env)
        assert code == 0, err
        if client.usage().jobs == usage.jobs:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the tenant's job counts never held still for one `pdppo usage`")
    lines = out.splitlines()
    jobs = ", ".join(
        f"{usage.jobs[s]} {s}"
        for s in ("queued", "running", "paused", "succeeded", "failed", "cancelled")
    )
    assert lines[:3] == [f"tenant {TENANT}", f"jobs: {jobs}", f"files: {usage.files}"]
    assert re.fullmatch(r"bytes: \d+ \(no quota\): \d+ of files, \d+ of job artifacts", lines[3])
    code, out, _ = _run(["usage", "--json"], cli_env)
    assert json.loads(out)["tenant"] == TENANT
