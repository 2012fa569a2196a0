"""The artifact folder's disk: uploaded datasets, the space kept free, deletion and retention,
and each tenant's quota. `pdppo.settings.Settings` inherits these fields (one settings object,
read from `PDPPO_*`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field
from pydantic_settings import BaseSettings

if TYPE_CHECKING:
    from core.disk.storage import Reserve


class StorageSettings(BaseSettings):
    # Uploaded datasets (`POST /v1/files`, pdppo.files): stored under <artifact_dir>/files, which
    # the API and the workers share, as the checkpoints are.
    max_file_bytes: int = Field(
        default=512 * 2**20,
        ge=1,
        le=2**30,  # core.disk.safe_files.DEFAULT_MAX_BYTES: the largest dataset a worker reads
        description="largest uploaded file (bytes of the JSONL itself); a larger upload gets 413",
    )
    max_files_per_tenant: int = Field(
        default=1000, ge=1, description="uploaded files a tenant may keep; past it uploads get 429"
    )
    max_file_bytes_per_tenant: int = Field(
        default=10 * 2**30,
        ge=1,
        description=(
            "bytes of uploaded files a tenant may keep, all files together; an upload past it "
            "gets 413"
        ),
    )

    # Disk space (core.disk.storage): what the artifact folder's disk keeps free. A worker refuses
    # to start a job, or to write a checkpoint, that would leave less (failure code storage_full);
    # an upload that would is answered 507; /readyz and `pdppo_disk_free_bytes` report it.
    min_free_bytes: int = Field(
        default=256 * 2**20,
        ge=0,
        description=(
            "bytes the artifact folder's disk keeps free: jobs, checkpoints and uploads that "
            "would leave less are refused (storage_full, 507)"
        ),
    )
    min_free_ratio: float = Field(
        default=0.0,
        ge=0.0,
        lt=1.0,
        description="the same as a share of the disk's size; the larger of the two applies",
    )

    # Deletion and retention (`pdppo.store.deletion`, `workers.upkeep.retention`,
    # `api.routes.storage`).
    retention_days: float = Field(
        default=0,
        ge=0,
        description=(
            "the workers delete the artifacts of jobs that ended longer ago than this many days "
            "(checkpoints, inputs, and final/ unless PDPPO_KEEP_FINAL_MODELS); the job's record, "
            "metrics and events stay; 0 keeps everything"
        ),
    )
    keep_final_models: bool = Field(
        default=True,
        description=(
            "retention keeps final/ of succeeded jobs (their model stays downloadable and usable "
            "as `job:<id>`); false deletes it with the rest"
        ),
    )
    retention_interval_seconds: float = Field(
        default=3600, ge=1, description="how often each worker runs the retention pass"
    )
    max_storage_bytes_per_tenant: int = Field(
        default=0,
        ge=0,
        description=(
            "bytes a tenant may keep, uploads and job artifacts together; past it uploads and "
            "job submissions get 507; 0: no limit"
        ),
    )
    usage_cache_seconds: float = Field(
        default=30,
        ge=0,
        description=(
            "the storage quota checks a tenant's bytes as measured on disk at most this long ago"
        ),
    )

    def storage_reserve(self) -> Reserve:
        """The space kept free on the artifact folder's disk (`core.disk.storage.Reserve`)."""
        from core.disk.storage import Reserve

        return Reserve(min_bytes=self.min_free_bytes, ratio=self.min_free_ratio)
