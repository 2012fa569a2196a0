"""Retention: the workers delete what ended jobs no longer need, and finish interrupted deletes.

Every worker runs `start_retention` next to its reaper, as a thread of its own (a pass walks the
artifact store, which may take a while, and must not hold up the reaper's repairs). Each pass:

1. removes the folders of deleted jobs whose deleter (the API) died before it removed them (the
   purge set, `pdppo.store.deletion`), once PURGE_GRACE_SECONDS old, so as not to race a delete
   still in progress;
2. with PDPPO_RETENTION_DAYS set, expires the artifacts of every job that ended longer ago than
   that: its checkpoints, its inputs (links to uploads), its logs, everything in its folder but
   `final/` of a succeeded job when PDPPO_KEEP_FINAL_MODELS is true (the default: a model is
   what a user came for, and `job:<id>` specs start from it). The job's record, metrics and
   events stay, so its history is still listed; the record gets `artifacts_expired_at`.

Whether a job may be expired is decided by a script (`Retention.expire`) from the record itself:
a queued, running or paused job never is, nor one whose worker still holds its lease, nor one
whose final model an active job of the tenant starts from. The pass finds jobs by their folders
(`<artifact_dir>/<job id>`), so it costs what is on disk, not the whole history in Redis.
Several workers may run passes at once: every step is idempotent.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import redis

from pdppo.disk_usage import JOB_ID_RE, remove_job_dir
from pdppo.settings import Settings
from pdppo.store import TERMINAL, JobStore, now_iso
from pdppo.store.deletion import Retention
from pdppo.store.keys import PURGE_SET

log = logging.getLogger(__name__)
PURGE_GRACE_SECONDS = 60.0
"""A delete removes its job's folder within a second of its script; one left this long lost its
deleter."""
FINAL_DIR = "final"


@dataclass
class RetentionReport:
    purged: list[str] = field(default_factory=list)  # folders of deleted jobs removed
    expired: dict[str, list[str]] = field(default_factory=dict)  # job id: names removed


def _iso(epoch: float) -> str:
    stamp = datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def retention_once(
    store: JobStore,
    artifact_dir: Path,
    *,
    days: float,
    keep_final: bool,
    now: float | None = None,
) -> RetentionReport:
    """One pass (see the module's docstring); `days` 0 only finishes interrupted deletes."""
    now = time.time() if now is None else now
    retention = Retention(store.redis)
    report = RetentionReport()
    for job_id in retention.purge_due(PURGE_GRACE_SECONDS, now=now):
        try:
            if JOB_ID_RE.match(job_id):
                remove_job_dir(artifact_dir, job_id)
        except OSError:
            log.warning("could not remove the folder of deleted job %s", job_id, exc_info=True)
            continue
        retention.purged(job_id)
        report.purged.append(job_id)
    if days <= 0:
        return report
    cutoff = _iso(now - days * 86400)
    try:
        names = sorted(e.name for e in os.scandir(artifact_dir) if JOB_ID_RE.match(e.name))
    except FileNotFoundError:
        return report
    for job_id in names:
        try:
            job = store.get(job_id)
        except (KeyError, ValueError):  # a record that is not a whole job's: not ours to judge
            log.warning("job %s: its record is incomplete; its folder is left alone", job_id)
            continue
        if job is None or job.status not in TERMINAL:
            continue  # not a job of this store, or one in progress: never ours to touch
        outcome = retention.expire(
            job_id, job.tenant, cutoff=cutoff, now=now_iso(), keep_final=keep_final
        )
        if outcome not in ("expire", "expired"):
            continue
        keep = [FINAL_DIR] if keep_final and job.status == "succeeded" else []
        try:
            removed = remove_job_dir(artifact_dir, job_id, keep=keep)
        except OSError:  # marked expired: the next pass removes what is left
            log.warning("could not remove the artifacts of job %s", job_id, exc_info=True)
            continue
        if removed or outcome == "expire":
            report.expired[job_id] = removed
            log.info("job %s ended before %s: removed %s", job_id, cutoff, removed or "nothing")
    return report


def start_retention(store: JobStore, settings: Settings) -> threading.Event:
    """Runs `retention_once` now and every PDPPO_RETENTION_INTERVAL_SECONDS (at most every
    PURGE_GRACE_SECONDS while deletes wait to be finished) in a daemon thread; set the event to
    stop. A pass that fails (Redis away, a folder that cannot be removed) is logged and tried
    again at the next."""
    stop = threading.Event()

    def loop() -> None:
        wait = 0.0
        while not stop.wait(wait):
            wait = settings.retention_interval_seconds
            try:
                report = retention_once(
                    store,
                    settings.artifact_dir,
                    days=settings.retention_days,
                    keep_final=settings.keep_final_models,
                )
                if report.purged:
                    log.warning("removed the folders of deleted jobs %s", report.purged)
                if store.redis.zcard(PURGE_SET) > 0:
                    wait = min(wait, PURGE_GRACE_SECONDS)
            except redis.RedisError:
                log.warning("retention could not reach Redis; trying again later", exc_info=True)
            except Exception:
                log.exception("retention pass failed; trying again later")

    threading.Thread(target=loop, name="pdppo retention", daemon=True).start()
    return stop
