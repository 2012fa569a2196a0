"""`pdppo dev` as a newcomer runs it: the real command, its real children, real signals."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from pdppo.client import Client
from tests.client.dev_process import DevProcess, descendants, running
from tests.support.specs import smoke_spec, write_spec

pytestmark = pytest.mark.integration


def test_dev_runs_the_demo_keeps_its_data_and_stops_cleanly(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "demo.yaml", smoke_spec(steps=3) | {"name": "dev-demo"})
    data = tmp_path / "data"
    common = ["--port", "0", "--data-dir", str(data)]

    dev = DevProcess(["--demo", "--spec", str(spec), *common], cwd=tmp_path, sigint_ignored=True)
    try:
        url, key = dev.url_and_key()
        job_id = dev.wait_for(r"demo job (\w+) succeeded").group(1)
        dev.wait_for("the stack is still up")
        children = descendants(dev.proc.pid)
        assert len(children) >= 3, children  # redis-server, the API, the worker
        with Client(url, key) as client:
            job = client.get(job_id)
            assert (job.status, job.name, job.progress.step) == ("succeeded", "dev-demo", 3)
            assert (data / "dev.env").read_text() == (
                f"export PDPPO_URL={url}\nexport PDPPO_API_KEY={key}\n"
            )
            # Ctrl-C in the middle of a job: the worker checkpoints and hands it back.
            busy = client.submit(smoke_spec(steps=40, checkpoint_every=2) | {"name": "busy"})
            deadline = time.monotonic() + 120
            while client.get(busy.id).progress.step < 3:
                assert time.monotonic() < deadline, client.get(busy.id)
                time.sleep(0.1)

        asked = time.monotonic()
        assert dev.stop(signal.SIGINT) == 130  # Ctrl-C
        assert time.monotonic() - asked < 30
    finally:
        dev.kill()
    assert "stopped: redis, api, worker, webhook worker and sample worker are down." in dev.output
    deadline = time.monotonic() + 10
    while any(running(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in children if running(p)], "pdppo dev left processes behind"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/healthz", timeout=2)

    # Again on the same folder: same key, and Redis's append-only file kept the job.
    again = DevProcess(common, cwd=tmp_path)
    try:
        url2, key2 = again.url_and_key()
        again.wait_for("Ctrl-C stops everything")
        children = descendants(again.proc.pid)
        assert key2 == key
        with Client(url2, key2) as client:
            assert client.get(job_id).status == "succeeded"
            assert [r.step for r in client.metrics(job_id)] == [1, 2, 3]
            # The interrupted job resumes from its checkpoint and finishes, no step twice.
            assert list(client.follow(busy.id))[-1].json() == {"status": "succeeded"}
            assert [r.step for r in client.metrics(busy.id)] == list(range(1, 41))
            assert client.get(busy.id).attempts == 2
        assert again.stop(signal.SIGTERM) == 130
    finally:
        again.kill()
    deadline = time.monotonic() + 10
    while any(running(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in children if running(p)], "pdppo dev left processes behind"


def test_dev_once_exits_nonzero_when_the_demo_fails(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "bad.yaml", smoke_spec(steps=0))  # the API refuses it: 422
    dev = DevProcess(
        ["--demo", "--once", "--spec", str(spec), "--port", "0", "--data-dir", str(tmp_path)],
        cwd=tmp_path,
    )
    try:
        assert dev.proc.wait(180) == 1
    finally:
        dev.kill()
    dev.wait_for(
        "stopped: redis, api, worker, webhook worker and sample worker are down.", timeout=5
    )
    assert re.search(r"demo failed: HTTP 422 .*train\.steps", dev.output), dev.output
