"""`pdppo dev` run by click in this process (its Redis, API and worker are real children): what
goes to stdout and what to stderr, the exit status of a demo job that runs and fails, and the
checks made before anything starts. A few seconds each, so the commands' mutation group runs
them in its quick tests; tests/client/test_dev.py runs the command as a user does."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdppo.cli import main
from pdppo.commands.dev import _tenant_names
from tests.support.specs import smoke_spec, write_spec

pytestmark = pytest.mark.integration


def test_a_demo_job_that_fails_exits_1_on_a_free_port_when_the_asked_one_is_busy(
    tmp_path: Path,
) -> None:
    spec = smoke_spec(steps=2)
    # under the allowed data root (the working directory), so the API takes it; the worker fails
    missing = Path.cwd() / "no-such-dir" / f"{tmp_path.name}.jsonl"
    spec["train"]["task"] = {"name": "jsonl", "path": str(missing)}
    demo = write_spec(tmp_path / "fails.yaml", spec | {"name": "dev-fails"})
    data = tmp_path / "data"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        args = ["dev", "--demo", "--once", "--spec", str(demo), "--port", str(port)]
        result = CliRunner().invoke(main, [*args, "--data-dir", str(data)])
    assert result.exit_code == 1, result.output
    assert f"port {port} is busy; using a free one" in result.stderr
    assert "busy" not in result.stdout
    api = re.search(r"API      http://127\.0\.0\.1:(\d+)", result.stdout)
    assert api is not None and int(api.group(1)) not in (port, 0), result.stdout
    job_id = re.search(r"demo job (\w+) submitted from", result.stderr)
    assert job_id is not None, result.stderr
    assert result.stdout.splitlines()[-1] == f"demo job {job_id.group(1)} failed"
    assert f"see {data / 'logs' / 'worker.log'}" in result.stderr.splitlines()
    stopped = "stopped: redis, api, worker, webhook worker and sample worker are down."
    assert result.stderr.splitlines()[-1] == stopped


def test_a_demo_the_api_refuses_exits_1_and_says_why(tmp_path: Path) -> None:
    demo = write_spec(tmp_path / "bad.yaml", smoke_spec(steps=0))  # the API answers 422
    args = ["dev", "--demo", "--once", "--spec", str(demo), "--port", "0"]
    result = CliRunner().invoke(main, [*args, "--data-dir", str(tmp_path / "data")])
    assert result.exit_code == 1, result.output
    failed = [line for line in result.stderr.splitlines() if line.startswith("demo failed: ")]
    assert len(failed) == 1 and failed[0].startswith("demo failed: HTTP 422 "), result.stderr
    assert "train.steps" in failed[0]
    assert "demo job" not in result.stdout


def test_dev_checks_its_options_before_starting_anything(tmp_path: Path) -> None:
    # first: a check that let 'dev' through would start a stack that waits for Ctrl-C
    assert _tenant_names(("bob", "alice", "bob")) == ["bob", "alice"]
    runner = CliRunner()
    once = runner.invoke(main, ["dev", "--once", "--data-dir", str(tmp_path / "d")])
    assert once.exit_code == 2
    assert "--once only makes sense with --demo" in once.output
    assert not (tmp_path / "d").exists()
    default = runner.invoke(main, ["dev", "--tenant", "dev", "--data-dir", str(tmp_path / "d")])
    assert default.exit_code == 2
    assert "Invalid value for --tenant: 'dev' is the default tenant" in default.output
    helped = " ".join(runner.invoke(main, ["dev", "--help"]).output.split())
    assert "--queues TEXT Queues the worker takes. [default: gpu,cpu]" in helped
