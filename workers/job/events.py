"""A job process's outgoing events and the trainer's callback (`workers.job.process`).

Training never waits on Redis, and a store error is never a training error
(docs/developers/design.md#redis-outages): the trainer's callback only appends to an ordered
outgoing queue (`EventPublisher`), which one thread publishes with retries and backoff through a
stall. Every event carries the claim's lease token, so the store refuses it once another claim may
hold the job (issue 12, `workers.job.lease`), and the callback stops the trainer, without a
checkpoint, as soon as that happens or the job process's own `LeaseFence` sees the lease lapse.
`backfill` republishes, on resume, the checkpointed steps that a killed run never got to Redis.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any, Protocol

from core.graders.batch import GRADING_COUNTS
from core.training.checkpoint import checkpoint_step, latest_checkpoint
from core.training.evaluation import Sample
from core.training.trainer import TrainerCallback
from pdppo.store import JobRecord, JobStore, StoreRetry, StoreUnavailable, now_iso
from pdppo.store.jobs.steering import Steering
from pdppo.store.jobs.worker_side import FencedOut
from pdppo.store.retry import log_fields
from pdppo.store.stats import TALLY
from workers.job.config_watch import ConfigWatch
from workers.job.cores import CoreShare
from workers.job.lease import LeaseFence, LeaseLost

log = logging.getLogger(__name__)

PHASE_EVERY_SECONDS = 1.0
"""Progress within a phase (warm-up step k of N) is published at most this often, and only
after another 1% of it: a fast warm-up of thousands of steps must not flood the event stream.
The first and last report of a phase always go out."""


class EventPublisher:
    """The job's outgoing events, in order, published by one thread so that the trainer never
    waits on Redis.

    Each event is retried (`StoreRetry`) until Redis takes it; the next one waits behind it, so
    the stream keeps the trainer's order. When Redis stays away past the outage bound
    (`unavailable`) or answers with an error that waiting does not cure (`error`), the publisher
    stops: `failed` tells the callback to stop the job, and the events still queued are dropped
    (a resumed job publishes its missing steps again, see `backfill`).

    Every event carries the claim's lease token (`fence`; none: unfenced, for tests): a refused
    one (`FencedOut`) sets `fenced`, tells the fence, and drops the rest, which nobody may
    publish any more."""

    def __init__(
        self,
        store: JobStore,
        job: JobRecord,
        retry: StoreRetry,
        fence: LeaseFence | None = None,
    ) -> None:
        self.store = store
        self.job = job
        self.retry = retry
        self.fence = fence
        self.token = fence.token if fence is not None else ""
        self.total_steps = job.total_steps  # as last changed (`config`)
        self.steering = Steering(store.redis)
        self.unavailable: StoreUnavailable | None = None
        self.error: Exception | None = None
        self.fenced: FencedOut | None = None
        self._queue: deque[tuple[str, Callable[[], object]]] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._drain, name="pdppo publisher", daemon=True)

    @property
    def failed(self) -> bool:
        """Gave up on Redis: the job stops, checkpointed (not when `fenced`: see there)."""
        return self.unavailable is not None or self.error is not None

    @property
    def stopped(self) -> bool:
        return self.failed or self.fenced is not None

    def start(self) -> None:
        self._thread.start()

    def step(self, step: int, metrics: dict[str, float]) -> None:
        job, total = self.job, self.total_steps
        self._put(
            f"publish step {step} of job {job.id}",
            lambda: self.store.publish_step(job.id, step, total, metrics, lease_token=self.token),
        )
        self.count_grading()

    def count_grading(self) -> None:
        """Queue a move of the grading counts into the service's counters."""
        self._put("count grading", self._flush_counts)

    def _flush_counts(self) -> None:
        """This process's grading counts into the service's counters (`pdppo.store.stats`),
        with each step: the step's grading has happened by the time its metrics go out."""
        for name, n in GRADING_COUNTS.take().items():
            TALLY.add("grading", name, n=n)
        TALLY.flush(self.store.redis)

    def checkpoint(self, step: int, name: str) -> None:
        job = self.job
        self._put(
            f"publish checkpoint {step} of job {job.id}",
            lambda: self.store.publish_checkpoint(job.id, step, name, lease_token=self.token),
        )

    def eval(self, step: int, metrics: dict[str, float]) -> None:
        job, total = self.job, self.total_steps
        self._put(
            f"publish the evaluation of step {step} of job {job.id}",
            lambda: self.store.publish_eval(job.id, step, total, metrics, lease_token=self.token),
        )

    def config(self, step: int, version: int, changes: dict[str, Any]) -> None:
        """The `config` event of a change applied from step `step + 1` (once per version)."""
        job = self.job
        if "steps" in changes:
            self.total_steps = int(changes["steps"])
        self._put(
            f"publish config {version} of job {job.id}",
            lambda: self.steering.announce(job.id, step, version, changes, lease_token=self.token),
        )

    def phase(self, name: str, done: int | None, total: int | None) -> None:
        """A `phase` event and the record's `phase`, stamped now."""
        job, at = self.job, now_iso()
        self._put(
            f"publish phase {name} of job {job.id}",
            lambda: self.store.publish_phase(
                job.id, name, done, total, at=at, lease_token=self.token
            ),
        )

    def trackers(self, runs: dict[str, dict[str, str]]) -> None:
        """The experiment-tracker runs the job reports to, into its record (`trackers`),
        merged with those told before (each tracker opens its run in its own time)."""
        job = self.job
        self._put(
            f"record the tracker runs of job {job.id}",
            lambda: self.store.publish_trackers(job.id, runs, lease_token=self.token),
        )

    def samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        job = self.job
        self._put(
            f"publish samples of step {step} of job {job.id}",
            lambda: self.store.publish_samples(job.id, step, samples, lease_token=self.token),
        )

    def log(self, message: str, level: str | None = None) -> None:
        """A `log` event; `level` ("warning") joins its data so clients can set it apart."""
        fields = log_fields(message)  # stamped now, however late Redis takes it
        if level is not None:
            fields["data"] = json.dumps({**json.loads(fields["data"]), "level": level})
        store, job_id, token = self.store, self.job.id, self.token
        # Once only however often retried (the script looks for it among the latest entries).
        self._put(
            f"log to job {job_id}", lambda: store.add_log_once(job_id, fields, lease_token=token)
        )

    def close(self) -> bool:
        """Wait until every queued event is published; False if the publisher gave up first."""
        self._put("count grading", self._flush_counts)  # the final evaluation's
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.ident is not None:  # started
            self._thread.join()
        return not self.stopped and not self._queue

    def abandon(self) -> None:
        """Drop what is queued and stop, without waiting (the lease is gone: nothing queued may
        be published, and the thread may sit in a retry through a stalled Redis)."""
        with self._cond:
            self._queue.clear()
            self._closed = True
            self._cond.notify_all()

    def _put(self, what: str, publish: Callable[[], object]) -> None:
        with self._cond:
            if self.stopped or self._closed:
                return
            self._queue.append((what, publish))
            self._cond.notify_all()

    def _drain(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                what, publish = self._queue[0]
            try:
                self.retry.call(what, publish)  # every publishing script is idempotent
            except FencedOut as exc:
                self._fence_out(exc)
                return
            except StoreUnavailable as exc:
                self._give_up(exc, None)
                return
            except Exception as exc:
                log.exception("could not %s", what)
                self._give_up(None, exc)
                return
            with self._cond:
                self._queue.popleft()

    def _fence_out(self, exc: FencedOut) -> None:
        with self._cond:
            self.fenced = exc
            self._queue.clear()
        log.warning("%s", exc)
        if self.fence is not None:
            self.fence.lose("a write was refused as stale", unreachable=False)

    def _give_up(self, unavailable: StoreUnavailable | None, error: Exception | None) -> None:
        with self._cond:
            self.unavailable, self.error = unavailable, error
            dropped = len(self._queue)
            self._queue.clear()
        log.error("stopped publishing; %d events not published", dropped)


class Sender(Protocol):
    """The job process's pipe to its worker (a `Connection`, or `job_process.WorkerPipe`)."""

    def send(self, obj: Any) -> None: ...


class JobCallback(TrainerCallback):
    """Hands the trainer's progress to the publisher; stops when the worker sets the event, or
    when the publisher gave up on Redis; raises `LeaseLost` (no checkpoint) once the claim lost
    its lease.

    The trainer writes a step's checkpoint right after its `on_step` (and `on_samples`,
    `on_eval`), and a stop's checkpoint right after `should_stop` says True: each of those first
    passes the fence's gate (`LeaseFence.ensure_held`, in memory while the lease is renewed), so
    a checkpoint is written only by the lease's holder."""

    def __init__(
        self,
        publisher: EventPublisher,
        stop: Event,
        conn: Sender,
        fence: LeaseFence | None = None,
        config: ConfigWatch | None = None,
        cancelled: Event | None = None,
        cores: CoreShare | None = None,
    ) -> None:
        self.publisher = publisher
        self.stop = stop
        self.cancelled = cancelled
        self.conn = conn
        self.fence = fence
        self.config = config
        self.cores = cores  # the job's share of the host's cores, applied at step boundaries
        self._heard = False  # the trainer heard the worker's stop (`Stop`): it was told so
        self._phase: tuple[str, int | None] | None = None  # the last published, and when
        self._phase_at = 0.0

    def config_update(self) -> tuple[int, dict[str, Any]] | None:
        return self.config.latest() if self.config is not None else None

    def on_config(self, step: int, version: int, changes: dict[str, Any]) -> None:
        self._ensure_held()
        self.publisher.config(step, version, changes)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self._ensure_held()
        self.publisher.step(step, clean_metrics(metrics))
        self._follow_cores()

    def _follow_cores(self) -> None:
        """On the training thread, at a boundary: the host's jobs changed, so did the share."""
        changed = self.cores.apply() if self.cores is not None else None
        if changed is not None:
            self.publisher.log(changed.describe())

    def on_checkpoint(self, step: int, path: Path) -> None:
        self.publisher.checkpoint(step, path.name)

    def on_eval(self, step: int, metrics: dict[str, float]) -> None:
        self._ensure_held()
        self.publisher.eval(step, clean_metrics(metrics))

    def on_samples(self, step: int, samples: list[Sample]) -> None:
        self._ensure_held()
        self.publisher.samples(step, samples)

    def on_trackers(self, runs: dict[str, dict[str, str]]) -> None:
        self.publisher.trackers(runs)

    def on_phase(self, name: str, done: int | None = None, total: int | None = None) -> None:
        self._follow_cores()  # the warm-up's steps too
        now = time.monotonic()
        if phase_due(self._phase, now - self._phase_at, name, done, total):
            self._phase, self._phase_at = (name, done), now
            self.publisher.phase(name, done, total)

    def on_log(self, message: str) -> None:
        self.publisher.log(message)

    def on_warning(self, message: str) -> None:
        """A `log` event with `"level": "warning"` (a run that learns nothing, say)."""
        log.warning("%s", message)
        self.publisher.log(message, level="warning")

    def should_stop(self) -> bool:
        """Whether a stop is requested (`core.training.callbacks.Stop`), asked before every
        token: in-memory flags only. The first True for the worker's stop is the trainer
        hearing it: the worker is told, so it waits for the checkpoint instead of killing the
        job. Raises `LeaseLost` once the lease is gone (a stale claim stops at once,
        without the checkpoint a True would write)."""
        self._raise_if_fenced()
        if self.publisher.failed:
            self._ensure_held()  # the stop's checkpoint follows
            return True
        if not self.stop.is_set():
            return False
        self._ensure_held()
        if not self._heard:
            self._heard = True
            with contextlib.suppress(OSError):
                self.conn.send({"kind": "stopping"})
        return True

    def stop_keeps_work(self) -> bool:
        """Whether the stop keeps work (`Stop`): a pause, a timeout, a worker shutdown or a
        Redis outage finishes the step it stops in and checkpoints it; a cancel (`cancelled`,
        set by the worker) keeps nothing."""
        return self.cancelled is None or not self.cancelled.is_set()

    def _raise_if_fenced(self) -> None:
        if self.fence is not None:
            self.fence.raise_if_lost()
        if self.publisher.fenced is not None:
            raise LeaseLost(str(self.publisher.fenced), unreachable=False)

    def _ensure_held(self) -> None:
        self._raise_if_fenced()
        if self.fence is not None:
            self.fence.ensure_held()


def phase_due(
    last: tuple[str, int | None] | None,
    elapsed: float,
    name: str,
    done: int | None,
    total: int | None,
) -> bool:
    """Whether a phase report goes out, given the last published (name, done) and the seconds
    since: a new phase, the first or last report of one, and progress in between only after
    `PHASE_EVERY_SECONDS` and another 1% of it."""
    if last is None or last[0] != name or last[1] is None or done is None or done == total:
        return True
    return elapsed >= PHASE_EVERY_SECONDS and (done - last[1]) * 100 >= (total or 0)


def clean_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The step is the event's own field; metrics are the numbers measured at it."""
    return {k: float(v) for k, v in metrics.items() if k != "step"}


def backfill(publisher: EventPublisher, out_dir: Path, job: JobRecord) -> int:
    """Queue the steps up to the checkpoint this run resumes from that Redis never got (the last
    run was stopped with events still queued), from its metrics.jsonl; returns how many. Each
    with its samples and evaluation (samples.jsonl, eval.jsonl), in the order the trainer made
    them.

    Steps past the checkpoint are not: the resumed run trains them again and publishes them.
    Events are published in order, so everything queued before the last published step (the
    record's `step`) is in Redis; that step's own samples and evaluation, queued after it, may
    not be, and are queued again (publishing is idempotent by step)."""
    ckpt = latest_checkpoint(out_dir)
    if ckpt is None:
        return 0
    upto = checkpoint_step(ckpt)
    queued = 0
    samples = dict(_rows(out_dir / "samples.jsonl"))
    evals = dict(_rows(out_dir / "eval.jsonl"))
    for step, row in _rows(out_dir / "metrics.jsonl"):
        if step > upto:
            continue
        if job.step < step:
            publisher.step(step, clean_metrics(row))
            queued += 1
        if job.step <= step and step in samples:
            publisher.samples(step, samples[step].get("samples", []))
        if job.step <= step and step in evals:
            publisher.eval(step, clean_metrics(evals[step]))
    publisher.checkpoint(upto, ckpt.name)
    return queued


def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(step, row) of each line of a trainer's `{"step": ...}` JSONL file."""
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    for line in lines:
        try:
            row = json.loads(line)
            yield int(row["step"]), row
        except (ValueError, KeyError, TypeError):
            continue  # a line torn by a kill mid-write
