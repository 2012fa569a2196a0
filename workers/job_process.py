"""The process a job trains in, apart from the worker that serves the queue.

A job may allocate until the kernel kills it, hang inside one enormous step, or crash the
interpreter; none of that may take the worker down with it, or leave it unable to stop the job.
So the worker (`workers.runner`) forks this process from a fork server that has already imported
torch and the trainer (a fresh job starts in milliseconds, and CUDA is never initialised in a
process that forks), watches it, and is the only one to write the job's final status.

The job process publishes its own steps, checkpoints and log lines to Redis, checks a stop event
that the worker sets (cancel, timeout, worker shutdown) before every generated token and every
minibatch, and sends one result message back over a pipe. It ignores SIGINT and SIGTERM (its
worker decides when it stops) and exits as soon as that pipe says the worker is gone, so a worker
killed with -9 never leaves a job writing behind it.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import resource
import signal
import threading
import traceback
from dataclasses import dataclass
from functools import lru_cache
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import redis

from core.budget import Limits
from core.trainer import TrainerCallback
from pdppo.spec import JobSpec
from pdppo.store import JobRecord, JobStore

log = logging.getLogger(__name__)
TRACEBACK_CHARS = 4000
EXIT_ORPHANED = 70  # the worker died; nothing was written after it did
# Imported once by the fork server, so every job process starts with them in memory.
PRELOAD = ["workers.job_process", "core.trainer", "core.models", "core.tasks", "pdppo.spec"]


@dataclass(frozen=True)
class JobOptions:
    """What the worker tells a job process; plain values, pickled through the fork server."""

    job_id: str
    redis_url: str
    out_dir: str
    resume: bool
    memory_limit_bytes: int  # RLIMIT_AS for CPU jobs; 0: none
    torch_threads: int | None
    log_level: str
    data_roots: tuple[str, ...]  # local models and datasets only from here (empty: none)
    limits: Limits  # the job's queue's budget, checked again here: the API may not see files


@lru_cache(maxsize=1)
def job_context() -> ForkServerContext:
    """The fork server job processes come from, started once per worker.

    It starts with SIGTERM ignored (dispositions survive its exec): `pdppo dev` and some process
    managers signal a worker's whole process group, and a fork server killed that way would take
    the exit status of the running job with it; the worker's own SIGTERM handling is untouched."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            from multiprocessing import forkserver

            forkserver.ensure_running()
        finally:
            signal.signal(signal.SIGTERM, previous)
    return ctx


class JobCallback(TrainerCallback):
    """Publishes the trainer's progress; stops when the worker sets the event."""

    def __init__(self, store: JobStore, job: JobRecord, stop: Event, conn: Connection) -> None:
        self.store = store
        self.job = job
        self.stop = stop
        self.conn = conn
        self._told = False

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        # The step is the event's own field; metrics are the numbers measured at it.
        clean = {k: float(v) for k, v in metrics.items() if k != "step"}
        self.store.publish_step(self.job.id, step, self.job.total_steps, clean)

    def on_checkpoint(self, step: int, path: Path) -> None:
        self.store.publish_checkpoint(self.job.id, step, path.name)

    def on_log(self, message: str) -> None:
        self.store.publish_log(self.job.id, message)

    def should_stop(self) -> bool:
        """Asked before every token: an in-memory flag only. The first True tells the worker
        that the stop was heard, so it waits for the checkpoint instead of killing the job."""
        if not self.stop.is_set():
            return False
        if not self._told:
            self._told = True
            with contextlib.suppress(OSError):
                self.conn.send({"kind": "stopping"})
        return True


def job_main(options: JobOptions, conn: Connection, stop: Event) -> None:
    """Entry point of the job process: train, then send one `result` message."""
    with contextlib.suppress(OSError):
        os.setsid()  # signals to the worker's process group are the worker's, not ours
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    _exit_with_worker(conn)
    logging.basicConfig(
        level=options.log_level.upper(),
        format=f"%(asctime)s %(levelname)s job {options.job_id} [pid %(process)d] %(message)s",
    )
    result = _run(options, conn, stop)
    conn.send({"kind": "result", **result})
    conn.close()


def _run(options: JobOptions, conn: Connection, stop: Event) -> dict[str, Any]:
    from core.trainer import resolve_device, train

    store = JobStore(redis.Redis.from_url(options.redis_url, decode_responses=True))
    job = store.get(options.job_id)
    if job is None:
        return {"outcome": "missing"}
    try:
        spec = JobSpec.model_validate_json(job.spec_json)
    except ValueError as exc:
        return _failure("invalid_spec", exc)
    try:
        problems = _over_budget(spec, job, options)
        if problems:
            return {"outcome": "failed", "code": "over_budget", "message": problems}
        if options.torch_threads:
            import torch

            torch.set_num_threads(options.torch_threads)
        if resolve_device(spec.train.device).type == "cpu" and options.memory_limit_bytes:
            _limit_memory(options.memory_limit_bytes)
        if options.resume:
            store.publish_log(job.id, "resuming from its latest checkpoint")
        result = train(
            spec.train,
            Path(options.out_dir),
            callback=JobCallback(store, job, stop, conn),
            resume=options.resume,
            data_roots=list(options.data_roots),
        )
    except Exception as exc:
        code = error_code(exc)
        log.exception("failed (%s)", code)
        return _failure(code, exc)
    if result.stopped:
        return {"outcome": "stopped", "step": result.step}
    final = str(result.final_model) if result.final_model else None
    return {"outcome": "succeeded", "step": result.step, "final_model": final}


def _over_budget(spec: JobSpec, job: JobRecord, options: JobOptions) -> str | None:
    """Why the job exceeds its queue's budget, as the API would have said; None if it fits.

    Checked here again because only the worker sees a local model's real size (the API may not
    share its disks) and an operator may have lowered the limits since the job was queued."""
    from core.budget import check, estimate

    budget = estimate(spec.train, queue=options.limits.queue, data_roots=list(options.data_roots))
    problems = check(budget, options.limits)
    return "; ".join(str(p) for p in problems) or None


def error_code(exc: BaseException) -> str:
    """`invalid_input` for data or a model the job may not or cannot read (the user's to fix),
    `out_of_memory`, else `training_error`."""
    from core.safe_files import UnsafeFileError

    if isinstance(exc, UnsafeFileError):
        return "invalid_input"
    return "out_of_memory" if is_out_of_memory(exc) else "training_error"


def is_out_of_memory(exc: BaseException) -> bool:
    """torch reports a failed host allocation as a RuntimeError, CUDA's as OutOfMemoryError."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and (
        "can't allocate memory" in text or "out of memory" in text
    )


def _failure(code: str, exc: BaseException) -> dict[str, Any]:
    text = "".join(traceback.format_exception(exc))
    return {
        "outcome": "failed",
        "code": code,
        "message": f"{type(exc).__name__}: {exc}"[:2000],
        "traceback": text[-TRACEBACK_CHARS:],
    }


def _limit_memory(limit: int) -> None:
    """Past `limit` bytes of address space, allocations fail inside the job (and it fails as
    out_of_memory) instead of the kernel's OOM killer choosing a victim on the machine."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _exit_with_worker(conn: Connection) -> None:
    """The worker never writes to the pipe, so it becomes readable only at EOF: the worker is
    gone (killed with -9, say) and its lease will pass to another worker. Stop writing now."""

    def watch() -> None:
        with contextlib.suppress(OSError):
            conn.poll(None)
        os._exit(EXIT_ORPHANED)

    threading.Thread(target=watch, name="pdppo worker watch", daemon=True).start()
