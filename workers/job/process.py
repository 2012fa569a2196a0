"""The process a job trains in, apart from the worker that serves the queue.

A job may allocate until the kernel kills it, hang inside one enormous step, or crash the
interpreter; none of that may take the worker down with it, or leave it unable to stop the job.
So the worker (`workers.job.runner`) forks this process from a fork server that has already imported
torch and the trainer (a fresh job starts in milliseconds, and CUDA is never initialised in a
process that forks), watches it, and is the only one to write the job's final status.

The job process publishes its own steps, evaluations, samples, checkpoints and log lines to
Redis, checks a stop event that the worker sets (cancel, pause, timeout, worker shutdown) before
every generated token, warm-up step and minibatch (a cancel stops at once, keeping nothing; any
other stop finishes the step it is in and checkpoints it), and sends one result message back over
a pipe, after its last event is in Redis (so the worker's `finish` comes after the last step).
It ignores SIGINT and SIGTERM (its worker decides when it stops) and exits as soon as that pipe
says the worker is gone, so a worker killed with -9 never leaves a job writing behind it.

Training never waits on Redis, and a store error is never a training error
(docs/developers/design.md#redis-outages): the trainer's callback only appends to an ordered
outgoing queue (`workers.job.events`), which one thread publishes with retries and backoff through a
stall. Steps, evaluations, samples and checkpoints are idempotent by step number, so a retry after a
lost reply is safe; a log line goes through a script that adds it only if it is not among the
stream's latest entries, so it lands exactly once. Only when Redis stays away past
`PDPPO_STORE_OUTAGE_SECONDS` does the job stop, cleanly: it checkpoints and reports `stopped` (`why:
store_unreachable`), and its worker hands it back. The worker may also kill the job on a lost lease
with events still queued: a resumed job first publishes, from `metrics.jsonl` (and `samples.jsonl`,
`eval.jsonl`), the steps up to its checkpoint that never made it to Redis, so no step is lost.

Only the current holder of the job's lease may write (issue 12, `workers.job.lease`): the worker may
be frozen past its lease while this process, in a session of its own, trains on, and a second
worker resumes the job meanwhile. Every event passes the claim's lease token and the store
refuses a stale one (`FencedOut`); a `LeaseFence` watches the lease from here and gates every
checkpoint. The first refusal or lapse stops the job at once with `LeaseLost` (not the trainer's
`StopRequested`, which would checkpoint): nothing more is published or written to the job folder,
and the result says `lease_lost`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import resource
import signal
import threading
import traceback
from dataclasses import dataclass, field
from functools import lru_cache
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

from core.budget import Limits
from core.disk.storage import Reserve
from core.graders.options import GraderOptions
from core.parallel.distributed import free_port
from core.tracking import TrackingOptions
from pdppo.files import FileStorage, InputFileError, job_input_files, spec_file_ids
from pdppo.job_models import JobModelError, resolve_job_model
from pdppo.spec import JobSpec
from pdppo.store import (
    FileStore,
    JobRecord,
    JobStore,
    StoreConfig,
    StoreRetry,
    StoreUnavailable,
    store_client,
)
from workers.job.config_watch import ConfigWatch
from workers.job.cores import CoreShare

# EventPublisher and backfill are re-exported: callers that predate the split import them here.
from workers.job.events import EventPublisher as EventPublisher
from workers.job.events import JobCallback
from workers.job.events import backfill as backfill
from workers.job.exits import error_code
from workers.job.lease import LeaseFence, LeaseLost
from workers.job.ranks import Failure, RankJob, data_parallel
from workers.job.storage import as_storage_error, refuse_for_storage

log = logging.getLogger(__name__)
TRACEBACK_CHARS = 4000
EXIT_ORPHANED = 70  # the worker died; nothing was written after it did
# Imported once by the fork server, so every job process starts with them in memory.
PRELOAD = [
    "workers.job.process",
    "core.training.trainer",
    "core.models",
    "core.tasks",
    "pdppo.spec",
    "torch._dynamo",  # the first AdamW imports it: 1.6-2 s of every job, paid once here instead
]


@dataclass(frozen=True)
class JobOptions:
    """What the worker tells a job process; plain values, pickled through the fork server."""

    job_id: str
    redis_url: str
    out_dir: str
    resume: bool
    memory_limit_bytes: int  # RLIMIT_AS for CPU jobs; 0: none
    # PDPPO_JOB_THREADS; None: a share of the cores (`core.process.threads`)
    torch_threads: int | None
    log_level: str
    data_roots: tuple[str, ...]  # local models and datasets only from here (empty: none)
    limits: Limits  # the job's queue's budget, checked again here: the API may not see files
    store: StoreConfig  # timeouts and outage bound of the job's Redis client
    artifact_dir: str  # uploaded files (task.file) are under <artifact_dir>/files (pdppo.files)
    lease_token: str  # the claim's fencing token: its worker's lease token (workers.job.lease)
    lease_seconds: float
    storage: Reserve = field(default_factory=Reserve)  # kept free (PDPPO_MIN_FREE_BYTES)
    # jobs sharing the worker's cores (PDPPO_WORKER_JOBS_AT_ONCE); None: counted on the host
    jobs_at_once: int | None = None
    threads_setting: str = "PDPPO_JOB_THREADS"  # the setting `torch_threads` came from
    # where `train.report_to` reports, and the operator's trackers (`pdppo.settings.tracking`)
    tracking: TrackingOptions | None = None
    # what OpenAI graders may do (`pdppo.settings.graders`); None: no python, no score_model
    graders: GraderOptions | None = None


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


def job_main(options: JobOptions, conn: Connection, stop: Event, cancelled: Event) -> None:
    """Entry point of the job process: train, then send one `result` message. `stop`: the
    worker asks it to stop (`cancelled` too for a cancel, which keeps nothing)."""
    with contextlib.suppress(OSError):
        os.setsid()  # signals to the worker's process group are the worker's, not ours
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    _exit_with_worker(conn)
    logging.basicConfig(
        level=options.log_level.upper(),
        format=f"%(asctime)s %(levelname)s job {options.job_id} [pid %(process)d] %(message)s",
    )
    pipe = WorkerPipe(conn)
    result = _run(options, pipe, stop, cancelled)
    pipe.send({"kind": "result", **result})
    conn.close()


class WorkerPipe:
    """The pipe to the worker, shared by the main thread and, in a multi-device job, the thread
    that watches the other ranks (`workers.job.ranks`): one message at a time."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, message: Any) -> None:
        with self._lock:
            self.conn.send(message)


def _run(options: JobOptions, conn: WorkerPipe, stop: Event, cancelled: Event) -> dict[str, Any]:
    store = JobStore(store_client(options.redis_url, options.store))
    retry = StoreRetry.from_config(options.store)
    try:
        job = retry.call(f"read job {options.job_id}", lambda: store.get(options.job_id))
    except StoreUnavailable as exc:
        log.error("%s", exc)
        return {"outcome": "stopped", "why": "store_unreachable", "step": 0}
    if job is None:
        return {"outcome": "missing"}
    try:
        spec = JobSpec.model_validate_json(job.spec_json)
    except ValueError as exc:
        return _failure("invalid_spec", exc)
    fence = LeaseFence(store.redis, job.id, options.lease_token, options.lease_seconds)
    fence.start()
    publisher = EventPublisher(store, job, retry, fence)
    publisher.start()
    try:
        result = _train(
            options,
            conn,
            spec,
            job,
            stop=stop,
            cancelled=cancelled,
            publisher=publisher,
            fence=fence,
        )
    except LeaseLost as lost:
        publisher.abandon()
        log.warning("%s; stopped without a checkpoint, leaving the job to its next holder", lost)
        return {"outcome": "lease_lost", "message": str(lost), "unreachable": lost.unreachable}
    finally:
        fence.stop()
    flushed = publisher.close()  # the worker's finish must come after the last event
    if publisher.fenced is not None:
        message = f"{publisher.fenced}; its last events were not published"
        return {"outcome": "lease_lost", "message": message, "unreachable": False}
    if publisher.error is not None and result["outcome"] != "failed":
        return _failure("store_error", publisher.error)
    if not flushed and result["outcome"] in ("succeeded", "stopped"):
        # Checkpointed (a stopped or finished run always is): resumed, its steps published.
        return {"outcome": "stopped", "why": "store_unreachable", "step": result.get("step", 0)}
    return result


def _train(
    options: JobOptions,
    conn: WorkerPipe,
    spec: JobSpec,
    job: JobRecord,
    *,
    stop: Event,
    cancelled: Event,
    publisher: EventPublisher,
    fence: LeaseFence,
) -> dict[str, Any]:
    """The trainer on the job's spec; its stop is requested through `stop`, and keeps no work
    when `cancelled` is set too (`core.training.callbacks.Stop`, `JobCallback`). Raises
    `LeaseLost` when the claim loses its lease (and the trainer stops mid-way)."""
    from core.training.trainer import resolve_device, train

    try:
        file_paths = _input_files(spec, job, options, publisher)
    except InputFileError as exc:
        return {"outcome": "failed", "code": "invalid_input", "message": str(exc)}
    except StoreUnavailable as exc:
        log.error("%s", exc)
        return {"outcome": "stopped", "why": "store_unreachable", "step": 0}
    except OSError as exc:  # its own copy of a file could not be written
        return _failure_of(exc, options)
    try:
        model_dir = resolve_job_model(
            spec.train.model.name,
            job.tenant,
            Path(options.artifact_dir),
            lambda other: publisher.retry.call(
                f"read job {other} (the model of job {job.id})", lambda: publisher.store.get(other)
            ),
        )
    except JobModelError as exc:
        return {"outcome": "failed", "code": "invalid_input", "message": str(exc)}
    except StoreUnavailable as exc:
        log.error("%s", exc)
        return {"outcome": "stopped", "why": "store_unreachable", "step": 0}
    try:
        problems = _over_budget(spec, job, options, model_dir)
        if problems:
            return {"outcome": "failed", "code": "over_budget", "message": problems}
        refused = _refused_graders(spec, options) or _unloadable_graders(spec, options)
        if refused:
            return {"outcome": "failed", "code": "invalid_input", "message": refused}
        out_dir, roots = Path(options.out_dir), list(options.data_roots)
        full = refuse_for_storage(spec.train, out_dir, options.storage, roots, model_dir)
        if full is not None:
            return {"outcome": "failed", "code": "storage_full", "message": str(full)}
        size = spec.resources.gpus
        cuda = resolve_device(spec.train.device).type == "cuda"
        cores = _core_share(options, size, publisher, job.id)
        threads = cores.share.threads
        if not cuda and options.memory_limit_bytes:
            _limit_memory(options.memory_limit_bytes // size)  # each rank's share of the job's
        if options.resume:
            publisher.log("resuming from its latest checkpoint")
            missing = backfill(publisher, Path(options.out_dir), job)
            if missing:
                log.info("publishing %d steps the last run trained but never published", missing)
        config = ConfigWatch(publisher.steering, job.id)
        config.start()
        run = functools.partial(
            train,
            spec.train,
            Path(options.out_dir),
            callback=JobCallback(
                publisher, stop, conn, fence=fence, config=config, cancelled=cancelled, cores=cores
            ),
            resume=options.resume,
            data_roots=list(options.data_roots),
            file_paths=file_paths,
            model_dir=model_dir,
            tracking=options.tracking,
            grader_options=options.graders,
        )
        try:
            if size == 1:
                result = run()
            else:
                ranks = RankJob(
                    job_id=job.id,
                    config_json=spec.train.model_dump_json(),
                    out_dir=options.out_dir,
                    resume=options.resume,
                    data_roots=options.data_roots,
                    file_paths={k: str(v) for k, v in file_paths.items()},
                    model_dir=str(model_dir) if model_dir else None,
                    size=size,
                    port=free_port(),
                    cuda=cuda,
                    torch_threads=threads,
                    log_level=options.log_level,
                    grader_options=options.graders,
                    storage=options.storage,
                )
                _check_devices(size, cuda)
                publisher.log(f"training on {size} devices ({'nccl' if cuda else 'gloo'})")
                fail = functools.partial(_rank_failed, conn, publisher, fence)
                with data_parallel(ranks, fail, cores.threads) as world:
                    result = run(world=world)
                publisher.count_grading()  # the other ranks' last step, heard as they left
        finally:
            config.stop()
            cores.stop()
    except LeaseLost:
        raise
    except Exception as exc:
        return _failure_of(exc, options)
    if result.stopped:
        return {"outcome": "stopped", "step": result.step}
    final = str(result.final_model) if result.final_model else None
    warnings = [{"code": w.code, "message": w.message} for w in result.warnings]
    return {"outcome": "succeeded", "step": result.step, "final_model": final, "warnings": warnings}


def _core_share(
    options: JobOptions, size: int, publisher: EventPublisher, job_id: str
) -> CoreShare:
    """torch threads of each rank (`core.process.threads`: torch's default, every core in every
    process, oversubscribes): the operator's setting, else the cores over the jobs running on
    this host (`workers.job.cores`, kept up to date), then over the job's ranks. Set here for
    rank 0 and said in the job's log; later changes at step boundaries (`JobCallback`)."""
    from core.process.threads import ThreadShare, asked_threads, own_cores, share_cores

    asked, setting = asked_threads(options.torch_threads, options.threads_setting)
    cores, fixed = own_cores(), options.jobs_at_once

    def share_of(running: int) -> ThreadShare:
        if fixed is not None:
            return share_cores(cores, fixed, size, asked, setting)
        return share_cores(cores, running, size, asked, setting, counted=True)

    share = CoreShare(publisher.store.redis, job_id, share_of)
    share.start()
    share.apply()
    publisher.log(share.share.describe())
    return share


def _check_devices(size: int, cuda: bool) -> None:
    """A GPU worker that sees fewer GPUs than the job's ranks is misconfigured: say so now,
    not as a CUDA error in a rank."""
    if not cuda:
        return
    import torch

    seen = torch.cuda.device_count()
    if seen < size:
        raise RuntimeError(
            f"the job needs {size} GPUs (resources.gpus) and this worker sees {seen}; start "
            f"it with `pdppo worker --gpus` naming {size} or more"
        )


def _rank_failed(
    conn: WorkerPipe, publisher: EventPublisher, fence: LeaseFence, failure: Failure
) -> None:
    """Another rank of this job raised or died: its error is the job's. Called from the ranks'
    watch while the main thread may wait in a collective forever, so this process ends here,
    after its queued events are published (the worker's finish must come after them)."""
    code, message, text = failure
    publisher.close()
    fence.stop()
    result = {"outcome": "failed", "code": code, "message": message, "traceback": text}
    with contextlib.suppress(OSError):
        conn.send({"kind": "result", **result})
    os._exit(1)


def _input_files(
    spec: JobSpec, job: JobRecord, options: JobOptions, publisher: EventPublisher
) -> dict[str, Path]:
    """The job's own link to each uploaded file its spec names, by file id (`pdppo.files`):
    made on the first run from the tenant's file records, reused as they are by a resumed run.
    InputFileError when a file was deleted before the job first started."""
    named = spec_file_ids(spec.train.task)
    if not named:
        return {}
    records = FileStore(publisher.store.redis)
    storage = FileStorage(Path(options.artifact_dir))

    def locate(file_id: str) -> Path | None:
        record = publisher.retry.call(
            f"read file {file_id} of job {job.id}", lambda: records.get(job.tenant, file_id)
        )
        return storage.path(job.tenant, record.sha256) if record is not None else None

    return job_input_files(named, Path(options.out_dir), locate)


def _over_budget(
    spec: JobSpec, job: JobRecord, options: JobOptions, model_dir: Path | None = None
) -> str | None:
    """Why the job exceeds its queue's budget, as the API would have said; None if it fits.

    Checked here again because only the worker sees a local model's real size (the API may not
    share its disks) and an operator may have lowered the limits since the job was queued."""
    from core.budget import check, estimate

    budget = estimate(
        spec.train,
        queue=options.limits.queue,
        data_roots=list(options.data_roots),
        model_dir=model_dir,
        devices=spec.resources.gpus,
    )
    problems = check(budget, options.limits)
    return "; ".join(str(p) for p in problems) or None


def _refused_graders(spec: JobSpec, options: JobOptions) -> str | None:
    """Why this worker will not run the spec's OpenAI graders, or None. The API refused them
    with its own settings; a worker whose operator settings differ (python graders off, no
    score model endpoint) says so here, before it loads the model."""
    from core.config.graders import OpenAIGrader
    from core.graders.openai import refusals

    grader = spec.train.task.grader
    if not isinstance(grader, OpenAIGrader):
        return None
    found = refusals(grader.grader, "train.task.grader.grader", options.graders)
    return "; ".join(why for _, why in found) + " (this worker's settings)" if found else None


def _unloadable_graders(spec: JobSpec, options: JobOptions) -> str | None:
    """Why the spec's python graders cannot load (a top level that raises, exits or runs past
    PDPPO_OPENAI_PYTHON_LOAD_SECONDS), or None: their code runs once now, in a grading server of
    its own, before the model loads, so that such a job fails at once as `invalid_input` rather
    than scoring 0 on every step. A server that cannot start for another reason is left to the
    trainer, which reports it per step as before."""
    from core.graders import GraderLoadError, StartFailed, load_python_graders

    try:
        load_python_graders(spec.train.task.grader, "train.task.grader", options.graders)
    except GraderLoadError as exc:
        return str(exc)
    except StartFailed as exc:
        log.warning("could not check the python graders before training: %s", exc)
    return None


def _failure_of(exc: Exception, options: JobOptions) -> dict[str, Any]:
    """The failed result of `exc`; a write the disk refused is told as the disk's error."""
    shown = as_storage_error(exc, Path(options.out_dir)) or exc
    code = error_code(shown)
    log.exception("failed (%s)", code)
    return _failure(code, shown)


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
