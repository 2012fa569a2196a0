"""A warm-up seen through the CLI on the real stack: `pdppo submit --follow` prints its progress
and `pdppo status` names it while it runs.

These need the worker to report phases (the job record's `phase`, the SSE `phase` event), which
the trainer and worker gain beside this CLI (pdppo issue 36); before that they fail."""

from __future__ import annotations

import re
import time
from pathlib import Path

from click.testing import CliRunner

from pdppo.cli import main
from pdppo.client import Client
from tests.support.specs import smoke_spec, write_spec


def _run(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, args, env=env)
    return result.exit_code, result.stdout, result.stderr


def _warm_up_spec(warmup_steps: int, steps: int) -> dict[str, object]:
    spec = smoke_spec(steps=steps, checkpoint_every=0) | {"name": "warm-up"}
    spec["train"]["task"] |= {"warmup_steps": warmup_steps, "warmup_batch_size": 4}
    return spec


def test_submit_follow_shows_the_warm_up(tmp_path: Path, cli_env: dict[str, str]) -> None:
    spec = write_spec(tmp_path / "warm.yaml", _warm_up_spec(warmup_steps=20, steps=2))
    code, out, err = _run(["submit", str(spec), "--follow"], cli_env)
    assert code == 0, (out, err)
    lines = out.splitlines()
    warm = [line for line in lines if line.startswith("phase: warm-up ")]
    assert warm and warm[-1] == "phase: warm-up 20/20", out  # the last of a phase is always sent
    assert all(re.fullmatch(r"phase: warm-up \d+/20", line) for line in warm), warm
    assert len(warm) <= 12, warm  # a line per tenth in a log, not one per event
    assert lines.index(warm[-1]) < lines.index("phase: training 0/2"), out


def test_status_names_the_phase_while_running(tmp_path: Path, cli_env: dict[str, str]) -> None:
    spec = write_spec(tmp_path / "long.yaml", _warm_up_spec(warmup_steps=5000, steps=2))
    job_id = _run(["submit", str(spec)], cli_env)[1].strip()
    try:
        deadline = time.monotonic() + 90
        while True:
            code, out, err = _run(["status", job_id], cli_env)
            assert code == 0, (out, err)
            found = re.search(r"^phase: warm-up (\d+)/5000$", out, re.MULTILINE)
            if found:
                break
            assert time.monotonic() < deadline, out
            time.sleep(0.5)
    finally:
        with Client(cli_env["PDPPO_URL"], cli_env["PDPPO_API_KEY"]) as client:
            client.cancel(job_id)
