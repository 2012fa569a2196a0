"""`pdppo dev` runs a sample worker: a succeeded job's model answers `Client.complete` and
`pdppo sample`, the same text as the job's final model loaded here with the trainer's code."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from core.config import ModelConfig
from core.models import load_model
from core.models.tiny import ByteTokenizer
from core.rollout.completions import complete
from pdppo.cli import main
from pdppo.client import ApiError, Client
from tests.client.dev_env import dev_env_file, wait_for_log
from tests.client.dev_process import DevProcess
from tests.support.specs import smoke_spec

pytestmark = pytest.mark.integration


def test_dev_answers_completions_from_the_client_and_the_cli(tmp_path: Path) -> None:
    data = tmp_path / "data"
    dev = DevProcess(["--port", "0", "--data-dir", str(data)], cwd=tmp_path)
    try:
        dev.wait_for("Ctrl-C stops everything")
        assert "sample-worker,webhook-worker,redis}.log" in dev.output
        wait_for_log(data / "logs" / "sample-worker.log", " ready.")
        url, key = dev_env_file(data)
        with Client(url, key) as client:
            job = client.submit(smoke_spec(steps=2))
            with pytest.raises(ApiError) as early:
                client.complete(job.id, "12=")
            assert early.value.status_code == 409
            deadline = time.monotonic() + 120
            while (status := client.get(job.id).status) != "succeeded":
                assert status in ("queued", "running") and time.monotonic() < deadline, status
                time.sleep(0.2)
            got = client.complete(job.id, "12=", max_tokens=4, temperature=0)
        folder = data / "artifacts" / job.id / "final"
        lm = load_model(ModelConfig(name=f"job:{job.id}"), torch.device("cpu"), model_dir=folder)
        lm.module.eval()
        expected = complete(lm, ByteTokenizer().encode_prompt("12="), max_tokens=4, temperature=0)
        assert [c.text for c in got.choices] == [expected.choices[0].text]
        assert got.usage.prompt_tokens == 4 and got.model == f"job:{job.id}"

        env = {"PDPPO_URL": url, "PDPPO_API_KEY": key}
        args = ["sample", job.id, "12=", "--max-tokens", "4", "--temperature", "0"]
        result = CliRunner().invoke(main, args, env=env, catch_exceptions=False)
        assert result.exit_code == 0, result.stderr
        assert result.stdout == expected.choices[0].text + "\n"
        assert "4 prompt + " in result.stderr and "warm" in result.stderr
        missing = CliRunner().invoke(main, ["sample", "nope", "x"], env=env)
        assert missing.exit_code == 2 and "HTTP 404" in missing.stderr
        assert dev.stop(signal.SIGTERM) == 130
    finally:
        dev.kill()
    assert "sample-worker stopped by pdppo dev" in (data / "logs" / "sample-worker.log").read_text()
