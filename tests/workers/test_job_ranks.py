"""`workers.job_ranks` helpers that the service tests cannot isolate."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.stack import REPO, running, smoke_spec, still_running
from workers.job_ranks import RankJob, Ranks

# A parent that starts one child armed with `die_with_parent` (which then says so in a file),
# prints the child's pid, and sleeps.
PARENT = """
import multiprocessing, os, pathlib, sys, time
from core.parent_death import die_with_parent

def child(parent, armed):
    if die_with_parent(parent):
        pathlib.Path(armed).touch()
    time.sleep(60)

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=child, args=(os.getpid(), sys.argv[1]))
    proc.start()
    print(proc.pid, flush=True)
    time.sleep(60)
"""


def test_a_rank_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A rank busy with its own work (no collective to notice a dead peer) still ends when its
    job process is killed with -9: the parent-death signal, not a 60 s sleep, ends it."""
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    repo = Path(__file__).resolve().parents[2]
    armed = tmp_path / "armed"
    parent = subprocess.Popen(
        [sys.executable, str(script), str(armed)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    deadline = time.monotonic() + 60
    while not armed.exists():
        assert time.monotonic() < deadline, "the child never armed its parent-death signal"
        time.sleep(0.05)
    assert running(child)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(10)
    assert still_running([child], 5) == []


def _armed_signal(parent: int, sig: int, report: Any) -> None:
    """In a spawned child: arm, then read back the parent-death signal (PR_GET_PDEATHSIG)."""
    import ctypes

    from core.parent_death import die_with_parent

    alive = die_with_parent(parent, sig)
    got = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(2, ctypes.byref(got))  # PR_GET_PDEATHSIG, linux/prctl.h
    report.put((alive, got.value))


def test_the_parent_death_signal_is_armed_with_the_signal_asked_for() -> None:
    """The kernel holds the signal `die_with_parent` armed (read back in the child, which ends
    normally: the test above kills its child, so coverage never sees what ran there), and
    a parent that is not the child's says so (False: the caller exits)."""
    ctx = multiprocessing.get_context("spawn")
    for parent, sig, want in (
        (os.getpid(), signal.SIGKILL, (True, signal.SIGKILL)),
        (os.getpid(), signal.SIGTERM, (True, signal.SIGTERM)),
        (os.getpid() + 1, signal.SIGKILL, (False, signal.SIGKILL)),
    ):
        report = ctx.Queue()
        child = ctx.Process(target=_armed_signal, args=(parent, int(sig), report))
        child.start()
        assert report.get(timeout=60) == (want[0], int(want[1]))
        child.join(10)


def test_a_ranks_exit_is_described_by_its_rank_and_signal() -> None:
    job = RankJob("j1", "{}", "/nonexistent", False, (), {}, None, 3, 1, False, 1, "INFO")
    ranks = Ranks(job, on_failure=lambda failure: None)

    class Exited:
        def __init__(self, code: int) -> None:
            self.exitcode = code
            self.sentinel, ended = os.pipe()  # ready, as an exited process's sentinel is
            os.close(ended)

        def join(self, timeout: float | None = None) -> None:
            pass

    ranks.procs = [Exited(0), Exited(-signal.SIGKILL)]  # type: ignore[list-item]
    assert ranks._failure_of(11, {11: 1, 12: 2}) is None  # rank 1 left after the barrier
    code, message, _ = ranks._failure_of(12, {11: 1, 12: 2})  # type: ignore[misc]
    assert code == "training_error"
    assert message.startswith("rank 2 of 3 was killed by SIGKILL")
    assert message.endswith("; the job's other ranks were stopped")


# A job process of 2 ranks whose watch is slow (each thing it sees waits `slow` seconds): rank 1
# is killed with -9 after rank 0's step 3, so rank 0's next collective fails ("Connection reset")
# before the watch has seen the death: the order of the race that CI met. Prints who failed the
# job: "watch: <message>" (the watch's on_failure) or "rank 0: <error>".
SLOW_WATCH = """
import multiprocessing, os, signal, sys, time
from pathlib import Path

from core.callbacks import TrainerCallback
from core.config import TrainConfig
from core.distributed import free_port
from core.trainer import train
from workers import job_ranks

config_json, out, slow = sys.argv[1], sys.argv[2], float(sys.argv[3])
seen = job_ranks.Ranks._failure_of

def slow_failure_of(self, ready, sentinels):
    time.sleep(slow)
    return seen(self, ready, sentinels)

job_ranks.Ranks._failure_of = slow_failure_of

def failed(failure):
    print("watch:", failure[1], flush=True)
    os._exit(3)

class KillRankOne(TrainerCallback):
    def on_step(self, step, metrics):
        if step == 3:
            [rank] = multiprocessing.active_children()
            os.kill(rank.pid, signal.SIGKILL)

if __name__ == "__main__":
    job = job_ranks.RankJob("j1", config_json, out, False, (), {}, None, 2, free_port(), False,
                            1, "WARNING")
    try:
        with job_ranks.data_parallel(job, failed) as world:
            train(TrainConfig.model_validate_json(config_json), Path(out),
                  callback=KillRankOne(), world=world)
    except Exception as exc:
        print("rank 0:", type(exc).__name__, str(exc)[:200], flush=True)
        sys.exit(4)
    print("finished", flush=True)
"""


@pytest.mark.parametrize("slow", [0.0, 0.5])
def test_a_rank_killed_while_rank_0_is_in_a_collective_is_the_jobs_error(
    tmp_path: Path, slow: float
) -> None:
    """Rank 0's collective error is only the echo of rank 1's death: the job's error names the
    death (CI once reported rank 0's gloo "Connection reset" instead), whichever is seen first."""
    from core.config import TrainConfig

    train = smoke_spec(steps=5000, checkpoint_every=0)["train"]
    config = TrainConfig.model_validate(train).model_dump_json()
    script = tmp_path / "job.py"
    script.write_text(SLOW_WATCH)
    proc = subprocess.run(
        [sys.executable, str(script), config, str(tmp_path / "out"), str(slow)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 3, (proc.stdout, proc.stderr[-3000:])
    assert proc.stdout.startswith("watch: rank 1 of 2 was killed by SIGKILL"), proc.stdout
