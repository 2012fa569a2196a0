"""The client's storage methods (deleting jobs, the tenant's usage), mixed into
`pdppo.client.Client`, apart from `pdppo.client` so that each module stays about one resource."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    import httpx


class StorageBytes(BaseModel):
    model_config = ConfigDict(extra="allow")

    files: int
    artifacts: int
    total: int


class Usage(BaseModel):
    """`GET /v1/usage`: jobs by status, files kept, bytes on disk and the storage quota (None:
    no quota); unknown fields are kept, not rejected."""

    model_config = ConfigDict(extra="allow")

    tenant: str
    jobs: dict[str, int]
    files: int
    bytes: StorageBytes
    quota_bytes: int | None = None
    measured_at: datetime | None = None


class StorageMixin:
    """Storage methods of `Client`: it supplies `_request`."""

    if TYPE_CHECKING:

        def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response: ...

    def delete_job(self, job_id: str) -> None:
        """Deletes an ended job and everything it kept (events, metrics, checkpoints, final
        model); `get` answers 404 after. `ApiError` 409 while it is queued, running or paused,
        while its worker is still finishing it, or while an active job starts from its model."""
        self._request("DELETE", f"/v1/jobs/{job_id}")

    def usage(self) -> Usage:
        return Usage.model_validate(self._request("GET", "/v1/usage").json())
