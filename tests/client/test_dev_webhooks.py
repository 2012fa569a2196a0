"""`pdppo dev` runs a webhook worker beside the API and the training worker, supervised like it:
a webhook registered to a receiver on this machine (loopback, which `pdppo dev` allows) gets its
events signed, and after the webhook worker is killed it is restarted and delivers again."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from standardwebhooks import Webhook as Verifier

from pdppo.client import Client
from tests.client.dev_env import dev_env_file, wait_for_log
from tests.client.dev_process import DevProcess, descendants, wait_for_start, wait_gone
from tests.support.webhook_receiver import Received, Receiver

pytestmark = pytest.mark.integration


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver()
    made.start()
    yield made
    made.stop()


def arrived(receiver: Receiver, path: str, count: int) -> list[Received]:
    deadline = time.monotonic() + 60
    while len(got := receiver.at(path)) < count:
        assert time.monotonic() < deadline, f"{path} received only {len(got)}"
        time.sleep(0.1)
    return got


def test_dev_delivers_webhooks_and_restarts_a_killed_webhook_worker(
    tmp_path: Path, receiver: Receiver
) -> None:
    data = tmp_path / "data"
    log = data / "logs" / "webhook-worker.log"
    dev = DevProcess(["--port", "0", "--data-dir", str(data)], cwd=tmp_path)
    seen: set[int] = set()
    try:
        dev.wait_for("Ctrl-C stops everything")
        assert "webhook-worker,redis}.log" in dev.output
        first = wait_for_start(log, "webhook-worker", 1)
        wait_for_log(log, " ready.")
        seen |= descendants(dev.proc.pid)
        url, key = dev_env_file(data)
        with Client(url, key) as client:
            hook = client.create_webhook(f"{receiver.url}/ok?t=dev")  # loopback: allowed here
            assert hook.secret is not None
            sent = client.test_webhook(hook.id)
            got = arrived(receiver, "/ok?t=dev", 1)
            assert got[0].headers["webhook-id"] == sent.id
            assert Verifier(hook.secret).verify(got[0].body, got[0].headers)["type"] == (
                "webhook.test"
            )

            os.kill(first, signal.SIGKILL)
            dev.wait_for(rf"webhook-worker \(pid {first}\) killed by SIGKILL", 30)
            second = int(dev.wait_for(r"webhook-worker restarted \(pid (\d+)\)", 30).group(1))
            assert wait_for_start(log, "webhook-worker", 2) == second != first
            again = client.test_webhook(hook.id)
            got = arrived(receiver, "/ok?t=dev", 2)
            assert got[1].headers["webhook-id"] == again.id
        seen |= descendants(dev.proc.pid)
        assert dev.stop(signal.SIGTERM) == 130
    finally:
        dev.kill()
    assert "stopped: redis, api, worker, webhook worker and sample worker are down." in dev.output
    assert not wait_gone(seen), "pdppo dev left processes behind"
    assert "webhook-worker stopped by pdppo dev" in log.read_text()
