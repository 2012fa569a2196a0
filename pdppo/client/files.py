"""The client's uploaded-file methods (`/v1/files`), mixed into `pdppo.client.Client`.

Kept apart from `pdppo.client` (jobs, events, artifacts) so that each module stays about one
resource. Uploads stream the file from disk (httpx reads it in pieces), so a dataset of any size
the server takes costs the client no memory; so do downloads.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    import httpx

JSONL_CONTENT_TYPE = "application/x-ndjson"


class File(BaseModel):
    """An uploaded file as the server describes it; unknown fields are kept, not rejected."""

    model_config = ConfigDict(extra="allow")

    id: str
    filename: str = ""
    bytes: int = 0
    records: int = 0
    sha256: str = ""
    created_at: datetime | None = None
    purpose: str | None = None
    created: bool = True
    """False when the server already had this content (it answered 200, not 201)."""


class FilePage(BaseModel):
    """One page of `GET /v1/files`; pass `next_cursor` back to get the next page."""

    items: builtins.list[File]
    next_cursor: str | None = None


class FilesMixin:
    """File methods of `Client`: it supplies `_http`, `_request` and `_save`."""

    if TYPE_CHECKING:
        _http: httpx.Client

        def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response: ...

        def _write(
            self,
            method: str,
            path: str,
            *,
            settled: Callable[[Any], bool] | None = None,
            hint: str = "",
            prepare: Callable[[], dict[str, Any]] | None = None,
            **kwargs: Any,
        ) -> httpx.Response: ...

        def _save(self, url: str, target: Path) -> Path: ...

    def upload_file(self, path: Path | str, purpose: str | None = None) -> File:
        """Uploads a JSONL dataset; its `id` goes in a spec's `train.task.file` (or
        `validation_file`). Uploading the same content again returns the same file (`created`
        False). The server checks every line and refuses the file whole (`ApiError` 422, the
        bad lines by number) if one is not a valid record. Retried through a store stall: the
        same content is the same file, never a second."""
        path = Path(path)
        data = {"purpose": purpose} if purpose is not None else None
        with path.open("rb") as fh:

            def rewound() -> dict[str, Any]:
                fh.seek(0)
                return {"files": {"file": (path.name, fh, JSONL_CONTENT_TYPE)}}

            response = self._write("POST", "/v1/files", prepare=rewound, data=data)
        return File.model_validate({**response.json(), "created": response.status_code == 201})

    def list_files(self, limit: int = 20, cursor: str | None = None) -> FilePage:
        """One page of this tenant's files, newest first."""
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        return FilePage.model_validate(self._request("GET", "/v1/files", params=params).json())

    def iter_files(self, page_size: int = 100) -> Iterator[File]:
        """Every file, walking the cursor pages (an iterator of `File`)."""
        cursor: str | None = None
        while True:
            page = self.list_files(limit=page_size, cursor=cursor)
            yield from page.items
            if not page.next_cursor or not page.items:
                return
            cursor = page.next_cursor

    def get_file(self, file_id: str) -> File:
        return File.model_validate(self._request("GET", f"/v1/files/{file_id}").json())

    def file_content(self, file_id: str) -> bytes:
        """The file's bytes, as uploaded (`download_file` streams a large one to disk)."""
        return self._request("GET", f"/v1/files/{file_id}/content").content

    def download_file(self, file_id: str, dest: Path) -> Path:
        """Saves the file's content to `dest` (a file, or a folder: `<dest>/<file id>.jsonl`).
        The file appears under its name only once complete."""
        target = dest / f"{file_id}.jsonl" if dest.is_dir() else dest
        return self._save(f"/v1/files/{file_id}/content", target)

    def delete_file(self, file_id: str) -> None:
        """Deletes the file. `ApiError` 409 while queued, running or paused jobs name it; ended
        jobs keep their own copy."""
        self._request("DELETE", f"/v1/files/{file_id}")
