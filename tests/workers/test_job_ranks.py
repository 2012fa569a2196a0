"""`workers.job.ranks` helpers that the service tests cannot isolate."""

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

from tests.support.specs import smoke_spec
from tests.support.stack import REPO, running, still_running
from workers.job.ranks import RankJob, Ranks

# A parent that starts one child armed with `die_with_parent` (which then says so in a file),
# prints the child's pid, and sleeps.
PARENT = """
import multiprocessing, os, pathlib, sys, time
from core.process.parent_death import die_with_parent

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

    from core.process.parent_death import die_with_parent

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
    job = RankJob(
        job_id="j1",
        config_json="{}",
        out_dir="/nonexistent",
        resume=False,
        data_roots=(),
        file_paths={},
        model_dir=None,
        size=3,
        port=1,
        cuda=False,
        torch_threads=1,
        log_level="INFO",
    )
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


def run_job_script(
    tmp_path: Path, source: str, steps: int, *args: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run a job-process script (argv: the smoke spec's train config of `steps` steps, an out
    dir, then `args`) on one torch thread, with the repository importable."""
    from core.config import TrainConfig

    train = smoke_spec(steps=steps, checkpoint_every=0)["train"]
    config = TrainConfig.model_validate(train).model_dump_json()
    script = tmp_path / "job.py"
    script.write_text(source)
    return subprocess.run(
        [sys.executable, str(script), config, str(tmp_path / "out"), *args],
        capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
    )  # fmt: skip


# A job process of 2 ranks whose watch is slow (each thing it sees waits `slow` seconds): rank 1
# is killed with -9 after rank 0's step 3, so rank 0's next collective fails ("Connection reset")
# before the watch has seen the death: the order of the race that CI met. Prints who failed the
# job: "watch: <message>" (the watch's on_failure) or "rank 0: <error>".
SLOW_WATCH = """
import multiprocessing, os, signal, sys, time
from pathlib import Path

from core.training.callbacks import TrainerCallback
from core.config import TrainConfig
from core.parallel.distributed import free_port
from core.training.trainer import train
from workers.job import ranks as job_ranks

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

    proc = run_job_script(tmp_path, SLOW_WATCH, 5000, str(slow), timeout=120)
    assert proc.returncode == 3, (proc.stdout, proc.stderr[-3000:])
    assert proc.stdout.startswith("watch: rank 1 of 2 was killed by SIGKILL"), proc.stdout


# A job process of 2 ranks training the tiny model through data_parallel, whose rank 0 either
# finishes its steps or raises at step 2 ("raise"). Prints how the context ended, the seconds
# from the end of training to the end of the context, and rank 1's exit code.
DATA_PARALLEL = """
import json, sys, time
from pathlib import Path

from core.training.callbacks import TrainerCallback
from core.config import TrainConfig
from core.parallel.distributed import free_port
from core.training.trainer import train
from workers.job import ranks as job_ranks

config_json, out, mode = sys.argv[1], sys.argv[2], sys.argv[3]
made = []

class Kept(job_ranks.Ranks):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        made.append(self)
        self.closing = None

    def close(self, failing):
        began = time.monotonic()
        try:
            return super().close(failing)
        finally:
            self.closing = time.monotonic() - began

job_ranks.Ranks = Kept
ended = []

class RaiseAtStep2(TrainerCallback):
    def on_step(self, step, metrics):
        if mode == "raise" and step == 2:
            ended.append(time.monotonic())
            raise RuntimeError("rank 0's own error")

def failed(failure):
    print(json.dumps({"end": "watch", "message": failure[1]}), flush=True)
    sys.exit(3)

if __name__ == "__main__":
    job = job_ranks.RankJob("j1", config_json, out, False, (), {}, None, 2, free_port(), False,
                            1, "WARNING")
    end = "finished"
    try:
        with job_ranks.data_parallel(job, failed) as world:
            train(TrainConfig.model_validate_json(config_json), Path(out),
                  callback=RaiseAtStep2(), world=world)
            ended.append(time.monotonic())
    except RuntimeError as exc:
        end = str(exc)
    [ranks] = made
    print(json.dumps({"end": end, "seconds": time.monotonic() - ended[0], "close": ranks.closing,
                      "exits": [proc.exitcode for proc in ranks.procs]}), flush=True)
"""


@pytest.mark.parametrize(
    ("mode", "want_end", "want_exits", "graces"),
    [
        # every rank meets at the final barrier and leaves on its own: no grace, no kill
        ("finish", "finished", [0], 0),
        # rank 0's own error: the watch gets PEER_GRACE_S to name another rank's death, then the
        # other ranks (waiting in the next step's collective) are killed, not joined
        ("raise", "rank 0's own error", [-signal.SIGKILL], 1),
    ],
    ids=["finish", "raise"],
)
def test_rank_0_leaving_data_parallel_ends_the_other_ranks_by_how_it_leaves(
    tmp_path: Path, mode: str, want_end: str, want_exits: list[int], graces: int
) -> None:
    import json

    from workers.job.ranks import PEER_GRACE_S

    proc = run_job_script(tmp_path, DATA_PARALLEL, 3, mode, timeout=180)
    assert proc.returncode == 0, (proc.stdout, proc.stderr[-3000:])
    got = json.loads(proc.stdout)
    assert (got["end"], got["exits"]) == (want_end, want_exits), proc.stderr[-3000:]
    # The grace is waited in the watch's close, and only there: a close that gives none takes
    # no time at all, one that waits for the watch takes PEER_GRACE_S (half of it is a gap no
    # busy machine closes). The whole end (barrier, join or kill, the group's teardown) has a
    # loose bound: a finished rank leaves in well under a second on an idle machine, a kill is
    # as quick, but under a parallel test run one took 11 s; a join in place of the kill: 60 s.
    assert (got["close"] >= PEER_GRACE_S / 2) == bool(graces), got
    assert graces * PEER_GRACE_S <= got["seconds"] < graces * PEER_GRACE_S + 30.0, got


def _rank_main_whose_join_fails(job: RankJob, rank: int, parent: int, conn: Any) -> None:
    """rank_main in a spawned child, its join_group replaced by one that raises what the rank
    looks like as it would start training: its torch threads and whether SIGINT and SIGTERM are
    ignored. os._exit raises SystemExit instead, so the child's coverage is still written (the
    mutation run's baseline reads which tests reach these lines from it)."""
    import torch

    from workers.job import ranks as job_ranks

    def join_group(*_: Any) -> None:
        ignored = [signal.getsignal(s) == signal.SIG_IGN for s in (signal.SIGINT, signal.SIGTERM)]
        raise RuntimeError(
            f"threads {torch.get_num_threads()}, SIGINT and SIGTERM ignored: {ignored} "
            + "x" * 5000
        )

    job_ranks.join_group = join_group  # type: ignore[assignment]
    os._exit = sys.exit  # type: ignore[assignment]
    job_ranks.rank_main(job, rank, parent, conn)


def _start_rank(parent: int, torch_threads: int | None) -> tuple[Any, Any]:
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe(duplex=False)
    job = RankJob(
        job_id="j1",
        config_json="{}",
        out_dir="/nonexistent",
        resume=False,
        data_roots=(),
        file_paths={},
        model_dir=None,
        size=2,
        port=1,
        cuda=False,
        torch_threads=torch_threads,
        log_level="INFO",
    )
    proc = ctx.Process(target=_rank_main_whose_join_fails, args=(job, 1, parent, theirs))
    proc.start()
    theirs.close()
    return proc, ours


def test_a_rank_that_fails_says_why_over_its_pipe_and_exits_1() -> None:
    """What the watch reads of a rank's error: its code, its message cut to 2000 characters and
    the last TRACEBACK_CHARS of its traceback; the rank exits 1. It fails with the job's torch
    threads set and the stop signals ignored (the job process decides when its ranks stop)."""
    from workers.job.ranks import TRACEBACK_CHARS

    proc, ours = _start_rank(os.getpid(), torch_threads=7)
    assert ours.poll(60), "the rank said nothing"
    code, message, text = ours.recv()
    proc.join(30)
    assert proc.exitcode == 1
    assert code == "training_error"
    head = "RuntimeError: threads 7, SIGINT and SIGTERM ignored: [True, True] xxx"
    assert message.startswith(head) and len(message) == 2000
    assert len(text) == TRACEBACK_CHARS and text.endswith("x" * 100 + "\n")


def test_a_rank_whose_job_process_is_gone_exits_1_without_a_word() -> None:
    """A rank started by a job process that died before the rank armed its parent-death signal
    would never get that signal: it leaves at once, and its exit (1, not 0: the watch reads 0 as
    a rank past the final barrier) is not a finished rank's."""
    proc, ours = _start_rank(os.getpid() + 100_000, torch_threads=None)
    proc.join(60)
    assert proc.exitcode == 1
    with pytest.raises(EOFError):
        ours.recv()  # closed without a word
