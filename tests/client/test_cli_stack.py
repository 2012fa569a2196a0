"""The client commands (`pdppo submit/status/list/cancel/logs`) against the real stack."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner

from pdppo.cli import main
from pdppo.client import Client
from tests.client.jobs import FinishedJob
from tests.client.proxy import DroppingProxy
from tests.support.specs import parked_spec, smoke_spec, write_spec
from tests.support.stack import KEYS, Service, pdppo_command


def _run(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, args, env=env, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_submit_follow_shows_progress_and_ends_succeeded(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    spec = write_spec(tmp_path / "job.yaml", smoke_spec(steps=3) | {"name": "cli-follow"})
    code, out, err = _run(["submit", str(spec), "--follow"], cli_env)
    assert code == 0, (out, err)
    job_id, status = out.strip().splitlines()[-1].split()
    assert status == "succeeded"
    assert f"submitted {job_id}" in err
    assert "3/3" in err and "reward=" in err  # the bar reached the end and showed metrics
    assert "status: running" in out


def test_status_list_and_logs_of_a_finished_job(
    finished_job: FinishedJob, cli_env: dict[str, str]
) -> None:
    job_id = finished_job.id
    code, out, _ = _run(["status", job_id], cli_env)
    assert code == 0 and job_id in out and "succeeded" in out and "4/4" in out
    code, out, _ = _run(["status", job_id, "--json"], cli_env)
    assert json.loads(out)["id"] == job_id

    code, out, _ = _run(["list", "--status", "succeeded", "--limit", "100"], cli_env)
    assert code == 0 and job_id in out
    assert all("succeeded" in line for line in out.strip().splitlines())
    code, out, _ = _run(["list", "--json"], cli_env)
    assert job_id in {json.loads(line)["id"] for line in out.strip().splitlines()}

    code, out, _ = _run(["logs", job_id, "--raw"], cli_env)
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) == len(finished_job.events)
    assert lines[-1] == f"{finished_job.events[-1].id} done {finished_job.events[-1].data}"
    since = finished_job.events[-3].id or ""
    code, out, _ = _run(["logs", job_id, "--raw", "--since", since], cli_env)
    assert [line.split()[0] for line in out.strip().splitlines()] == [
        e.id for e in finished_job.events[-2:]
    ]


def test_submit_cancel_and_logs_report_cancelled(tmp_path: Path, cli_env: dict[str, str]) -> None:
    spec = write_spec(tmp_path / "parked.yaml", parked_spec("cli-cancel"))
    code, out, _ = _run(["submit", str(spec)], cli_env)
    job_id = out.strip()
    assert code == 0 and len(job_id) > 8
    code, out, _ = _run(["cancel", job_id], cli_env)
    assert code == 0 and out.strip() == f"{job_id} cancelled"
    code, out, _ = _run(["logs", job_id], cli_env)
    assert code == 0  # replayed to its end; a cancel is how the job was meant to end
    assert out.strip().splitlines()[-1] == f"{job_id} cancelled"


@pytest.fixture(scope="module")
def ended(service: Service, finished_job: FinishedJob) -> dict[str, str]:
    """A job that ended each way: {how it ended: its id}."""
    with Client(service.base_url, KEYS["carol"]) as client:
        cancelled = client.submit(parked_spec("logs-cancelled")).id
        client.cancel(cancelled)
        spec = smoke_spec()
        spec["train"]["task"] = {"name": "jsonl", "path": f"{service.data_dir}/none/d.jsonl"}
        failed = client.submit(spec | {"name": "logs-failed"}).id
        for _ in client.follow(failed):
            pass
    return {"succeeded": finished_job.id, "cancelled": cancelled, "failed": failed}


@pytest.mark.parametrize("raw", [False, True], ids=["follow", "raw"])
@pytest.mark.parametrize(("how", "code"), [("succeeded", 0), ("cancelled", 0), ("failed", 1)])
def test_logs_exit_status_says_whether_the_job_failed(
    ended: dict[str, str], cli_env: dict[str, str], how: str, code: int, raw: bool
) -> None:
    """`pdppo logs` replays the stream to its end: 0 for a job that succeeded or was cancelled
    (issue 49: a cancelled job's logs exited 1), 1 for one that failed, either way of showing
    it (a script waiting on a job learns whether it failed)."""
    job_id = ended[how]
    got, out, _ = _run(["logs", job_id, *(["--raw"] if raw else [])], cli_env)
    assert got == code, out
    last = out.strip().splitlines()[-1]
    if raw:
        assert last.split(" ", 2)[1:] == ["done", json.dumps({"status": how})], last
    else:
        assert last == f"{job_id} {how}"


def test_errors_are_one_line_and_exit_nonzero(tmp_path: Path, cli_env: dict[str, str]) -> None:
    spec = write_spec(tmp_path / "bad.yaml", smoke_spec(steps=0))
    code, _, err = _run(["submit", str(spec)], cli_env)
    assert code == 2 and "HTTP 422" in err and "train.steps" in err

    code, _, err = _run(["list"], {**cli_env, "PDPPO_API_KEY": ""})
    assert code == 2 and "no API key" in err
    code, _, err = _run(["list"], {**cli_env, "PDPPO_API_KEY": "wrong"})
    assert code == 2 and "HTTP 401" in err
    code, _, err = _run(["status", "x", "--url", "http://127.0.0.1:9"], cli_env)
    assert code == 2 and "cannot reach http://127.0.0.1:9/v1/jobs/x" in err


def test_the_installed_command_follows_a_job(
    finished_job: FinishedJob, cli_env: dict[str, str]
) -> None:
    result = subprocess.run(
        [*pdppo_command(), "logs", finished_job.id],
        env={**os.environ, **cli_env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == f"{finished_job.id} succeeded"


def test_logs_resumes_through_a_dropped_connection(
    finished_job: FinishedJob, cli_env: dict[str, str]
) -> None:
    target = urlsplit(cli_env["PDPPO_URL"])
    proxy = DroppingProxy(target.hostname or "127.0.0.1", target.port or 80, cut_after=[700])
    try:
        code, out, _ = _run(["logs", finished_job.id, "--raw", "--url", proxy.url], cli_env)
    finally:
        proxy.close()
    assert (proxy.cuts, proxy.accepted) == (1, 2)
    assert code == 0
    assert [line.split()[0] for line in out.strip().splitlines()] == [
        e.id for e in finished_job.events
    ]


def test_set_pause_and_resume_a_queued_job(tmp_path: Path, cli_env: dict[str, str]) -> None:
    spec = write_spec(tmp_path / "parked.yaml", parked_spec("cli-steer"))
    job_id = _run(["submit", str(spec)], cli_env)[1].strip()
    try:
        code, out, err = _run(
            ["set", job_id, "optim.lr=1e-4", "train.algorithm.delta_high=0.25", "steps=20"], cli_env
        )
        assert code == 0, (out, err)
        assert out.strip() == f"{job_id} queued config_version=1"
        code, out, _ = _run(["status", job_id, "--json"], cli_env)
        job = json.loads(out)
        assert job["overrides"] == {
            "train": {"optim": {"lr": 1e-4}, "algorithm": {"delta_high": 0.25}, "steps": 20}
        }
        assert job["spec"]["train"]["optim"]["lr"] == 1e-4 and job["progress"]["total"] == 20

        code, out, err = _run(["set", job_id, "model.name=hf:gpt2"], cli_env)
        assert code != 0 and "train.model.name" in err and "cannot change" in err, (out, err)
        code, _, err = _run(["set", job_id, "lr"], cli_env)
        assert code != 0 and "expected KEY=VALUE" in err

        assert _run(["pause", job_id], cli_env)[1].strip() == f"{job_id} paused"
        assert _run(["resume", job_id], cli_env)[1].strip() == f"{job_id} queued"
        code, _, err = _run(["resume", job_id], cli_env)
        assert code != 0 and "not paused" in err
    finally:
        _run(["cancel", job_id], cli_env)


def test_logs_show_a_change_made_while_the_job_runs(
    tmp_path: Path, cli_env: dict[str, str]
) -> None:
    spec = write_spec(tmp_path / "long.yaml", smoke_spec(steps=300, checkpoint_every=0))
    job_id = _run(["submit", str(spec)], cli_env)[1].strip()
    with Client(cli_env["PDPPO_URL"], cli_env["PDPPO_API_KEY"]) as client:
        deadline = time.monotonic() + 60
        while client.get(job_id).progress.step < 2:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    code, out, err = _run(["set", job_id, "optim.lr=1e-4"], cli_env)
    assert code == 0, (out, err)
    code, out, err = _run(["logs", job_id], cli_env)
    assert code == 0, (out, err)
    lines = [line for line in (out + err).splitlines() if line.startswith("config 1 after step")]
    assert len(lines) == 1 and lines[0].endswith(": optim.lr=0.0001"), out + err


def test_follow_prints_each_warning_the_job_ended_with_once(
    service: Service, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    """The warnings a run ends with arrive twice: as `log` events of level warning on the
    stream, and in the job's record, which the follow reads at the end (issue 49: each was
    printed twice). A warning of the record that the stream did not show is still printed."""
    data = service.data_dir / "never.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{i}=", "answer": "~~~~"}) + "\n" for i in range(4))
    )
    spec = smoke_spec(steps=2, checkpoint_every=0)
    spec["train"]["task"] = {"name": "jsonl", "path": str(data)}
    path = write_spec(tmp_path / "never.yaml", spec | {"name": "never-rewarded"})
    code, out, err = _run(["submit", str(path), "--follow"], cli_env)
    assert code == 0, (out, err)
    shown = out + err
    for code_name in ("rewards_all_zero", "no_reward_variance"):
        assert shown.count(f"({code_name})") == 1, shown
