"""The other processes of a multi-device job (`resources.gpus: N`), kept by its job process.

A job of N devices trains as N data-parallel processes (`core.parallel.distributed`). The job
process (`workers.job.process`) is rank 0: it alone holds the lease's fence, publishes the events
and hears the worker's stop, so nothing about the service changes for it. It starts ranks 1..N-1 as
fresh interpreters (spawn: CUDA does not survive a fork), each on its own device, with a callback
that writes nothing: they train their share of every step. After each step a rank sends what it
graded to the job process over its pipe, and it follows the job's share of the host's cores
(`workers.job.rank_hooks`). A stop (cancel, pause, timeout, shutdown) reaches rank 0's callback and
the ranks agree on it at the next step boundary, or the next warm-up step (`World.agree`), so all of
them stop together and rank 0 writes the checkpoint (sharded: every rank its shard), of the
warm-up's progress too (`core.training.warmup`).

No rank may outlive the job, and no rank's death may leave the others waiting: a collective
whose peer is gone waits for the process group's timeout (30 minutes under gloo). So:

- each rank gets SIGKILL when the job process dies, however it dies (`PR_SET_PDEATHSIG`; the
  job process itself dies with its worker, `workers.job.process`), so a worker killed with -9
  leaves no rank behind;
- a thread of the job process watches every rank; when one raises (its error comes over a pipe)
  or dies (a signal, the OOM killer), the others are killed and the job fails with that rank's
  error, e.g. "rank 1 of 2 was killed by SIGKILL";
- when rank 0 itself stops early (an error, a lost lease), the other ranks are killed as it
  leaves; when the run ends, every rank meets at a barrier before the group is torn down.
- rank 0's error may be only the echo of another rank's death (gloo's "Connection reset" in
  the collective the dead rank left), and it can reach rank 0 before the watch has seen the
  death: so rank 0 leaving with an error first waits up to PEER_GRACE_S for the watch to name
  a rank that died or raised, whose error is then the job's.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from core.disk.storage import Reserve, set_reserve
from core.graders.batch import GRADING_COUNTS
from core.graders.options import GraderOptions
from core.parallel.distributed import World, join_group, leave_group
from core.process.parent_death import die_with_parent
from workers.job.exits import describe_exit, error_code

log = logging.getLogger(__name__)
TRACEBACK_CHARS = 4000
# How long rank 0, leaving with an error, waits for the watch to name another rank's death as
# the cause. A dead rank's sockets and its sentinel close together as the kernel ends it, so
# the watch sees it within milliseconds; an error of rank 0's own pays the whole wait.
PEER_GRACE_S = 3.0


@dataclass(frozen=True)
class RankJob:
    """What every rank trains, as the job process resolved it; plain values, pickled to each."""

    job_id: str
    config_json: str  # core.config.TrainConfig
    out_dir: str
    resume: bool
    data_roots: tuple[str, ...]
    file_paths: dict[str, str]  # uploaded files by id (`pdppo.files`), already linked
    model_dir: str | None  # the final model a `job:<id>` name stands for
    size: int
    port: int  # rank 0's rendezvous on 127.0.0.1
    cuda: bool  # nccl, one GPU per rank; else gloo on the CPU
    torch_threads: int | None
    log_level: str
    grader_options: GraderOptions | None = None  # the operator's (PDPPO_OPENAI_PYTHON_GRADERS...)
    # kept free on the disk (PDPPO_MIN_FREE_BYTES): each rank checks its own before a sharded
    # checkpoint (`core.training.checkpoint`)
    storage: Reserve = field(default_factory=Reserve)


# A rank's failure: (error code, message, traceback), as the job's `failed` result carries them.
Failure = tuple[str, str, str]
# A rank's other message, after each step: (GRADING, {completions, errors, timeouts}).
GRADING = "grading"


class Ranks:
    """Ranks 1..size-1 of a job and the thread that watches them."""

    def __init__(
        self, job: RankJob, on_failure: Callable[[Failure], None], threads: Any = None
    ) -> None:
        self.job = job
        self.on_failure = on_failure
        self.threads = threads  # the job's share of the cores (`workers.job.cores.CoreShare`)
        self.procs: list[BaseProcess] = []
        self.pipes: dict[Connection, int] = {}  # our end of each rank's error pipe -> rank
        self._lock = threading.Lock()
        self._reaping = threading.Lock()
        self._closing = False
        self.failed = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="pdppo ranks", daemon=True)

    def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent = os.getpid()
        for rank in range(1, self.job.size):
            ours, theirs = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=rank_main,
                args=(self.job, rank, parent, theirs, self.threads),
                name=f"pdppo-job-{self.job.job_id}-rank{rank}",
            )
            proc.start()
            theirs.close()
            self.procs.append(proc)
            self.pipes[ours] = rank
            log.info("job %s: rank %d of %d in process %d", self.job.job_id, rank,
                     self.job.size, proc.pid)  # fmt: skip
        self._watcher.start()

    def _watch(self) -> None:
        sentinels = {proc.sentinel: rank for rank, proc in enumerate(self.procs, start=1)}
        pending: list[Any] = [*self.pipes, *sentinels]
        while pending:
            for ready in wait(pending):
                failure, done = self._read(ready, sentinels)
                if done:
                    pending.remove(ready)
                if failure is not None:
                    self._fail(failure)
                    return

    def _read(self, ready: Any, sentinels: dict[int, int]) -> tuple[Failure | None, bool]:
        """What `ready` says: a failure, or None; and whether it has no more to say (a pipe
        goes on carrying grading counts until its rank's error or its end)."""
        if not isinstance(ready, Connection):
            return self._failure_of(ready, sentinels), True
        rank = self.pipes[ready]
        try:
            message = ready.recv()
        except (EOFError, OSError):
            return None, True  # closed without a word: its exit says how it ended
        if message[0] == GRADING:
            counts = message[1]
            GRADING_COUNTS.add(counts["completions"], counts["errors"], counts["timeouts"])
            return None, False
        code, text_message, text = message
        return (code, f"rank {rank} of {self.job.size}: {text_message}", text), True

    def _failure_of(self, ready: Any, sentinels: dict[int, int]) -> Failure | None:
        rank = sentinels[ready]
        code = self._exit_code(self.procs[rank - 1], None)
        if code == 0:
            return None  # past the final barrier
        _, message = describe_exit(code, oom_killed=False)
        message = message.replace("the job's process", f"rank {rank} of {self.job.size}")
        return "training_error", f"{message}; the job's other ranks were stopped", ""

    def _fail(self, failure: Failure) -> None:
        with self._lock:
            if self._closing:
                return  # rank 0 is leaving already and stops the others itself
            self.failed.set()
        log.error("job %s: %s", self.job.job_id, failure[1])
        self.kill()
        self.on_failure(failure)

    def kill(self) -> None:
        for proc in self.procs:
            if self._exit_code(proc, 0) is None:
                with contextlib.suppress(OSError):
                    proc.kill()
        for proc in self.procs:
            self._exit_code(proc, 10)

    def _exit_code(self, proc: BaseProcess, timeout: float | None) -> int | None:
        """The rank's exit code once it has ended, None while it runs after `timeout`. The watch
        and rank 0 both wait for ranks: one reaps at a time, since of two waitpid calls on one
        process CPython's Popen.poll gives the second no code at all (as if still running)."""
        if not wait([proc.sentinel], timeout):
            return None
        with self._reaping:
            proc.join()  # the process has exited (its sentinel closed): this waitpid is brief
            return proc.exitcode

    def close(self, failing: bool) -> bool:
        """Stop watching: from now on a rank's exit is rank 0's doing. False when the watch
        failed the job (the job process is exiting with that rank's error). `failing`: rank 0
        leaves with an error, which another rank's death may have caused: give the watch
        PEER_GRACE_S to say so first."""
        if failing:
            self.failed.wait(PEER_GRACE_S)
        with self._lock:
            self._closing = True
        return not self.failed.is_set()

    def join(self, timeout: float) -> None:
        """Wait for ranks that are leaving on their own; kill what is left. Then wait for the
        watch to have read all they sent (their last step's grading counts)."""
        for proc in self.procs:
            self._exit_code(proc, timeout)
        self.kill()
        self._watcher.join(timeout)


@contextlib.contextmanager
def data_parallel(
    job: RankJob, on_failure: Callable[[Failure], None], threads: Any = None
) -> Iterator[Any]:
    """Rank 0's `core.parallel.distributed.World` while ranks 1..size-1 train beside it in processes
    of their own. `on_failure` is called from the watching thread when another rank fails; it must
    end the job process (its main thread may be waiting in a collective that never completes).
    `threads`: the job's share of the cores (`CoreShare.threads`), which every rank follows. A
    run that finishes has the other ranks' grading counts in `GRADING_COUNTS` when this exits."""
    import torch.distributed as dist

    ranks = Ranks(job, on_failure, threads)
    ranks.start()
    finished = False
    try:
        join_group(0, job.size, job.port, job.cuda)
        yield World(0, job.size)
        finished = True
    finally:
        if not ranks.close(failing=not finished):
            threading.Event().wait()  # the watcher is ending this process with the rank's error
        if finished:
            dist.barrier()  # every rank done before any leaves (see `pdppo train --nproc`)
            ranks.join(60)
        else:
            ranks.kill()  # rank 0 stopped mid-run: the others would wait in a collective
        leave_group()


def rank_main(job: RankJob, rank: int, parent: int, conn: Connection, threads: Any = None) -> None:
    """Entry point of rank `rank` (>= 1): train the job's share, report an error, write nothing.
    `threads`: the job's share of the cores, shared with the job process."""
    if not die_with_parent(parent):
        os._exit(1)  # the job process is gone already
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # the job process decides when its ranks stop
    logging.basicConfig(
        level=job.log_level.upper(),
        format=f"%(asctime)s %(levelname)s job {job.job_id} rank {rank} [pid %(process)d] "
        "%(message)s",
    )
    try:
        _train_rank(job, rank, conn, threads)
    except BaseException as exc:
        from pathlib import Path

        from workers.job.storage import as_storage_error

        shown = as_storage_error(exc, Path(job.out_dir)) or exc
        text = "".join(traceback.format_exception(shown))[-TRACEBACK_CHARS:]
        with contextlib.suppress(OSError):
            conn.send((error_code(shown), f"{type(shown).__name__}: {shown}"[:2000], text))
        os._exit(1)


def _train_rank(job: RankJob, rank: int, conn: Connection, threads: Any) -> None:
    from pathlib import Path

    import torch
    import torch.distributed as dist

    from core.config import TrainConfig
    from core.training.trainer import train
    from workers.job.rank_hooks import RankCallback

    if job.torch_threads:
        torch.set_num_threads(job.torch_threads)
    set_reserve(job.storage)
    join_group(rank, job.size, job.port, job.cuda)
    train(
        TrainConfig.model_validate_json(job.config_json),
        Path(job.out_dir),
        callback=RankCallback(lambda counts: conn.send((GRADING, counts)), threads),
        resume=job.resume,
        data_roots=list(job.data_roots),
        file_paths={k: Path(v) for k, v in job.file_paths.items()},
        model_dir=Path(job.model_dir) if job.model_dir else None,
        world=World(rank, job.size),
        grader_options=job.grader_options,
    )
    dist.barrier()
    leave_group()
