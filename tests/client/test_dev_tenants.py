"""`pdppo dev --tenant NAME`: a key per extra tenant, printed, written next to dev.env and kept
across runs; each tenant sees only its own jobs, on a real `pdppo dev`."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from pdppo.client import ApiError, Client
from tests.client.dev_process import DevProcess
from tests.support.specs import parked_spec

pytestmark = pytest.mark.integration


def _env_file(path: Path) -> tuple[str, str]:
    found = re.fullmatch(r"export PDPPO_URL=(\S+)\nexport PDPPO_API_KEY=(\S+)\n", path.read_text())
    assert found is not None, path.read_text()
    return found.group(1), found.group(2)


def test_dev_tenants_have_their_own_keys_and_jobs(tmp_path: Path) -> None:
    data = tmp_path / "data"
    # the worker takes only cpu jobs, so the gpu jobs stay queued: nothing trains here
    common = ["--port", "0", "--data-dir", str(data), "--queues", "cpu"]
    dev = DevProcess([*common, "--tenant", "alice", "--tenant", "bob"], cwd=tmp_path)
    try:
        url, dev_key = dev.url_and_key()
        dev.wait_for("Ctrl-C stops everything")
        keys = {}
        for name in ("alice", "bob"):
            env_url, keys[name] = _env_file(data / f"dev-{name}.env")
            assert env_url == url
            assert f"  tenant   {name}: {keys[name]}  (source {data}/dev-{name}.env)" in dev.output
        assert _env_file(data / "dev.env") == (url, dev_key)
        assert len({dev_key, keys["alice"], keys["bob"]}) == 3

        jobs = {}
        for name in ("alice", "bob"):
            with Client(url, keys[name]) as client:
                jobs[name] = client.submit(parked_spec(f"{name}-job")).id
        for name, other in (("alice", "bob"), ("bob", "alice")):
            with Client(url, keys[name]) as client:
                assert [j.id for j in client.iter_jobs()] == [jobs[name]]
                with pytest.raises(ApiError) as hidden:
                    client.get(jobs[other])
                assert hidden.value.status_code == 404
        with Client(url, dev_key) as client:
            assert list(client.iter_jobs()) == []
        assert dev.stop(signal.SIGTERM) == 130
    finally:
        dev.kill()

    # Again on the same folder: the same keys, and the tenants' jobs are still theirs.
    again = DevProcess([*common, "--tenant", "alice"], cwd=tmp_path)
    try:
        url2, _ = again.url_and_key()
        again.wait_for("Ctrl-C stops everything")
        assert _env_file(data / "dev-alice.env") == (url2, keys["alice"])
        with Client(url2, keys["alice"]) as client:
            assert [j.id for j in client.iter_jobs()] == [jobs["alice"]]
        with Client(url2, keys["bob"]) as client, pytest.raises(ApiError) as gone:
            client.get(jobs["bob"])  # bob was not asked for this time: his key is refused
        assert gone.value.status_code == 401
        assert again.stop(signal.SIGTERM) == 130
    finally:
        again.kill()
