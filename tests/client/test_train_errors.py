"""`pdppo train` says why a run failed, whole: every field of a validation error, and with
`--debug` the traceback (a rank's own, for a data-parallel run). Issue 49: it printed the last
line of the exception, `Error: For further information visit https://errors.pydantic.dev/...`,
and `--debug` showed nothing more. Real `pdppo` processes, as a user runs them."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.stack import REPO, pdppo_command

SMOKE = REPO / "examples" / "smoke.yaml"
BAD_SETTINGS = {"PDPPO_LEASE_SECONDS": "abc", "PDPPO_MAX_JOB_DEVICES": "0"}


def _train(args: list[str], env: dict[str, str], debug: bool = False) -> tuple[int, str]:
    command = [*pdppo_command(), *(["--debug"] if debug else []), "train", *args, "--quiet"]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
    )
    return done.returncode, done.stderr


def test_a_bad_setting_is_told_field_by_field(tmp_path: Path) -> None:
    code, err = _train([str(SMOKE), "--out", str(tmp_path / "out")], BAD_SETTINGS)
    assert code == 2, err
    assert err.endswith(
        "Error: invalid PDPPO_* settings:\n"
        "  PDPPO_LEASE_SECONDS: Input should be a valid number, unable to parse string as a "
        "number\n"
        "  PDPPO_MAX_JOB_DEVICES: Input should be greater than or equal to 1\n"
    ), err
    assert "Traceback" not in err


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    code, err = _train([str(SMOKE), "--out", str(tmp_path / "out")], BAD_SETTINGS, debug=True)
    assert code == 1, err
    assert "Traceback (most recent call last)" in err
    assert "pydantic_core._pydantic_core.ValidationError: 2 validation errors for Settings" in err


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_a_ranks_failure_is_its_last_line_or_with_debug_its_traceback(
    tmp_path: Path, debug: bool
) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text('{"prompt": "1=", "answer": "1"}\n{"prompt": 5}\n')
    spec = yaml.safe_load(SMOKE.read_text())
    spec["train"]["task"] = {"name": "jsonl", "path": str(data)}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    code, err = _train([str(path), "--out", str(tmp_path / "out"), "--nproc", "2"], {}, debug)
    assert code == 1, err
    said = f"ValueError: task.path='{data}' line 2: 'prompt' must be a string, not a number"
    if not debug:
        assert err.endswith(
            f"Error: {said}; run again with --debug (or PDPPO_DEBUG=1) for the traceback "
            "of the rank\n"
        ), err
        assert "Traceback" not in err
    else:
        assert re.search(r"-- Process [01] terminated with the following error:", err), err
        assert 'core/tasks/records.py", line' in err and said in err, err
