""".ci/steps.sh, the step functions of .ci/run, driven by stand-in steps (sleep, false, a
script that tears down on a TERM): a step started beside the others fails the run when it fails,
with its log, whether it is joined or not; a failed step stops the steps still running beside it,
waiting for their teardown; every step prints its time, and the total comes last whatever
happened. A CI run that went green with a failed background step, or left a deployment up,
would be found only by reading its log."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_ci(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    """`body` as a .ci/run would be written after sourcing the step functions; its output and
    errors together in `stdout`."""
    script = tmp_path / "run"
    script.write_text(
        f"set -euo pipefail\n. {ROOT / '.ci' / 'steps.sh'}\ntrap finish EXIT\n{body}\n"
    )
    return subprocess.run(
        ["bash", str(script)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # in the order a CI log shows them
        text=True,
        timeout=60,
    )


def lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stdout.splitlines() if line.startswith("==")]


def test_steps_beside_and_in_line_print_their_times_and_the_total_comes_last(
    tmp_path: Path,
) -> None:
    done = run_ci(
        tmp_path,
        "beside slow bash -c 'sleep 2; echo slow output'\n"
        "step quick sleep 1\n"
        "joined slow\n"
        'cat "${beside_log[slow]}"\n'
        "step after true",
    )
    assert done.returncode == 0, done.stdout
    got = lines(done)
    assert got[0] == "== slow: started beside"
    assert re.fullmatch(r"== quick: [12]s", got[1]), got
    assert re.fullmatch(r"== slow \(beside\): 2s, joined after a wait of [01]s", got[2]), got
    assert "slow output" in done.stdout
    assert got[-2] == "== after: 0s"
    assert re.fullmatch(r"== total: [23]s", got[-1]), got


def test_a_failed_step_beside_fails_the_run_at_the_next_step_with_its_log(tmp_path: Path) -> None:
    done = run_ci(
        tmp_path,
        "beside broken bash -c 'echo what went wrong; exit 3'\n"
        "step wait sleep 1\n"
        "step never touch never-ran",
    )
    assert done.returncode == 3
    assert "what went wrong" in done.stdout
    assert "== broken (beside): failed (exit status 3)" in done.stdout
    assert not (tmp_path / "never-ran").exists()
    assert lines(done)[-1].startswith("== total: ")


def test_a_failed_step_beside_fails_the_run_at_its_join(tmp_path: Path) -> None:
    done = run_ci(
        tmp_path,
        "beside broken bash -c 'sleep 1; echo what went wrong; exit 4'\n"
        "joined broken\n"
        "touch never-ran",
    )
    assert done.returncode == 4
    assert "what went wrong" in done.stdout
    assert "== broken (beside): failed (exit status 4)" in done.stdout
    assert not (tmp_path / "never-ran").exists()
    assert lines(done)[-1].startswith("== total: ")


def test_a_failed_step_stops_the_steps_beside_and_waits_for_their_teardown(
    tmp_path: Path,
) -> None:
    """As .ci/compose does: on a TERM it tears its deployment down before it exits. The run
    ends after that, and still prints its total (a `wait` on the stopped step, returning 143
    under `set -e` in the exit trap, once ended the run there, without the total)."""
    deployment = tmp_path / "deployment"
    teardown = tmp_path / "teardown"
    teardown.write_text(
        "trap 'sleep 1; rm deployment; exit 143' TERM\ntouch deployment\nsleep 60 &\nwait\n"
    )
    done = run_ci(
        tmp_path,
        f"beside compose bash {teardown}\nstep wait sleep 1\nstep broken false",
    )
    assert done.returncode == 1
    assert not deployment.exists(), "the run ended before the step beside had torn down"
    assert lines(done)[-2:-1] == ["== compose (beside): stopped"]
    assert lines(done)[-1].startswith("== total: ")
    stray = subprocess.run(["pgrep", "-f", f"bash {teardown}"], capture_output=True, text=True)
    assert stray.stdout == ""


@pytest.mark.parametrize(
    ("name", "command"),
    [("mutation", ".ci/mutation changed"), ("mutation-tests", ".ci/mutation tests")],
)
def test_the_mutation_steps_run_beside_after_their_extras_and_their_failure_fails_the_run(
    name: str, command: str
) -> None:
    """.ci/run starts the changed-lines mutation and, apart, the tool's own tests (outside the
    mutation's 8-minute budget, which they took 2 to 5 minutes of) beside the steps after the
    install of their extras (cosmic-ray), and joins both before the run ends: a step beside
    that is never joined could fail unseen once the last foreground step has passed."""
    steps = [
        line.split("#", 1)[0].split()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.startswith(("step ", "beside ", "joined "))
    ]
    names = [" ".join(words[:2]) for words in steps]
    assert ["beside", name, *command.split()] in steps
    assert f"step {name}" not in names
    assert names.index("step install-extras") < names.index(f"beside {name}")
    assert names.index(f"joined {name}") > max(
        i for i, name in enumerate(names) if name.startswith("step ")
    )
