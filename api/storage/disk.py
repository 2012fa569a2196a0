"""The API's view of the artifact disk: room for an upload, `/readyz`'s report, and the gauges.

Uploads and the workers' checkpoints share the artifact folder's disk (`pdppo.files`), so the API
keeps the same reserve the workers do (`PDPPO_MIN_FREE_BYTES` / `PDPPO_MIN_FREE_RATIO`,
`core.disk.storage.Reserve`): an upload that would eat into it is refused with 507 before a byte is
written, when the request says its size.

`/readyz` stays ready on a low disk and says `disk: low` in its detail. A full disk stops writes
(uploads answer 507, workers refuse jobs with `storage_full`), but every read still works: job
status, events, metrics, downloads. A 503 would take the API out of its load balancer, and since
every replica shares the disk, all of them at once, turning a storage problem into an outage of
everything; the alert belongs on `pdppo_disk_free_bytes`, which this module also serves.

The gauges are read when Prometheus scrapes (a `statvfs` each, microseconds), never cached:
`pdppo_disk_free_bytes{folder="artifacts"|"uploads"}` and `pdppo_disk_total_bytes{...}`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from fastapi import HTTPException, Request
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from api.storage.uploads import drain
from core.disk.storage import disk_total, free_bytes
from pdppo.files import FILES_DIR
from pdppo.settings import Settings


def folders(settings: Settings) -> dict[str, Path]:
    """The folders the gauges report, by their `folder` label (a fixed, bounded set)."""
    return {"artifacts": settings.artifact_dir, "uploads": settings.artifact_dir / FILES_DIR}


async def refuse_without_room(request: Request, settings: Settings, framing_bytes: int) -> None:
    """507 before reading the body when the upload's declared size (Content-Length less the
    form's framing) would leave less than the reserve free; a body of unknown size (chunked)
    is checked as it is written instead (`api.storage.uploads`)."""
    declared = request.headers.get("content-length", "")
    if not declared.isdigit():
        return
    folder = folders(settings)["uploads"]
    incoming = max(int(declared) - framing_bytes, 1)
    keep = settings.storage_reserve().bytes_for(folder)
    free = free_bytes(folder)
    if free >= incoming + keep:
        return
    await drain(request)
    raise HTTPException(
        507,
        detail=(
            f"file: the server has no room for {incoming} more bytes ({free} free, {keep} of "
            "them kept free for running jobs: PDPPO_MIN_FREE_BYTES); try again later, or ask "
            "the operator to free space"
        ),
    )


def disk_detail(settings: Settings) -> str | None:
    """`/readyz`'s detail: which folders are below the reserve (None: none is)."""
    low = []
    for name, folder in folders(settings).items():
        try:
            free = free_bytes(folder)
            keep = settings.storage_reserve().bytes_for(folder)
        except OSError as exc:
            low.append(f"{name}: unreadable ({type(exc).__name__})")
            continue
        if free < keep:
            low.append(f"{name}: {free} bytes free, {keep} kept free")
    return f"disk: low ({'; '.join(low)})" if low else None


class DiskCollector(Collector):
    """Free and total bytes of each folder's file system, read at every scrape."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def collect(self) -> Iterator[GaugeMetricFamily]:
        free = GaugeMetricFamily(
            "pdppo_disk_free_bytes",
            "Bytes free for unprivileged writers on the folder's file system",
            labels=["folder"],
        )
        total = GaugeMetricFamily(
            "pdppo_disk_total_bytes", "Size of the folder's file system", labels=["folder"]
        )
        for name, folder in folders(self.settings).items():
            try:
                free.add_metric([name], free_bytes(folder))
                total.add_metric([name], disk_total(folder))
            except OSError:
                continue  # no sample rather than a wrong one
        yield free
        yield total


def disk_metrics(settings: Settings) -> bytes:
    """The gauges in Prometheus's text format, to append to the default registry's."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DiskCollector(settings))
    return generate_latest(registry)
