"""A reader that leaves early (`pdppo status ID | head -1`) ends a command as it ends a Unix
tool: quietly, with the status of one killed by SIGPIPE (141), never a traceback or "a bug in
pdppo?". Issue 49: `BrokenPipeError ... (a bug in pdppo?)` in 6 of 20 runs.

Real `pdppo` processes against the real stack. A pipe whose read end is closed before the
command starts makes every run meet the gone reader; `head -1` in a shell pipeline, run
repeatedly, is the race as a user meets it.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.client.jobs import FinishedJob
from tests.support.stack import pdppo_command

SIGPIPE_STATUS = 141
HEAD_RUNS = 12


def _env(cli_env: dict[str, str]) -> dict[str, str]:
    return {**os.environ, **cli_env, "PYTHONUNBUFFERED": ""}


@pytest.mark.parametrize(
    "args",
    [
        ["status", "{job}"],
        ["status", "{job}", "--json"],
        ["list"],
        ["list", "--json"],
        ["logs", "{job}"],
        ["logs", "{job}", "--raw"],
        ["usage"],
        ["usage", "--json"],
    ],
    ids=lambda args: " ".join(args),
)
def test_a_reader_gone_before_the_first_line_ends_the_command_quietly(
    finished_job: FinishedJob, cli_env: dict[str, str], args: list[str]
) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader has left before anything is written
    try:
        done = subprocess.run(
            [*pdppo_command(), *(a.replace("{job}", finished_job.id) for a in args)],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env=_env(cli_env),
        )
    finally:
        os.close(write)
    assert done.returncode == SIGPIPE_STATUS, done.stderr
    assert "Error" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    if args[0] != "logs":  # logs draws its progress on stderr
        assert done.stderr == ""


def test_status_piped_into_head_never_complains(
    finished_job: FinishedJob, cli_env: dict[str, str]
) -> None:
    command = " ".join([*pdppo_command(), "status", finished_job.id])
    script = f'{command} | head -1; echo "statuses ${{PIPESTATUS[*]}}" >&2'
    for _ in range(HEAD_RUNS):
        done = subprocess.run(
            ["bash", "-c", script],
            capture_output=True,
            text=True,
            timeout=120,
            env=_env(cli_env),
        )
        out, err = done.stdout, done.stderr
        assert out.startswith(f"{finished_job.id}  succeeded") and out.count("\n") == 1, out
        # 141 when head left before pdppo wrote its last line, 0 when it had written them all
        assert err in (f"statuses {SIGPIPE_STATUS} 0\n", "statuses 0 0\n"), err
