"""Multipart bodies cut into chunks for the upload parser (`api.storage.uploads`), and what it
leaves behind (tests/api/test_uploads.py, test_upload_forms.py, test_upload_disk_full.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from starlette.requests import Request
from starlette.types import Message

from api.storage.uploads import Upload, UploadRefused, receive_upload
from pdppo.files import (
    FileStorage,
)

BOUNDARY = "xYzBoundary42"


DATA = b'{"prompt": "12=", "answer": "21"}\r\n{"prompt": "--xYzBoundary4", "answer": "x"}\n'


def form(*parts: tuple[str, str | None, bytes]) -> bytes:
    """A multipart/form-data body of (name, filename, content) parts."""
    out = b""
    for name, filename, content in parts:
        disposition = f'form-data; name="{name}"'
        if filename is not None:
            disposition += f'; filename="{filename}"'
        out += f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()
        out += content + b"\r\n"
    return out + f"--{BOUNDARY}--\r\n".encode()


def request(body: bytes, chunk: int, content_type: str | None = None) -> Request:
    """A Starlette request whose body arrives in ASGI messages of `chunk` bytes."""
    pieces = [body[i : i + chunk] for i in range(0, len(body), chunk)] or [b""]
    messages: Iterator[Message] = iter(
        {"type": "http.request", "body": piece, "more_body": i < len(pieces) - 1}
        for i, piece in enumerate(pieces)
    )

    async def receive() -> Message:
        return next(messages)

    content_type = content_type or f"multipart/form-data; boundary={BOUNDARY}"
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": "/v1/files",
        "headers": [(b"content-type", content_type.encode())],
    }
    return Request(scope, receive)


def receive(tmp_path: Path, body: bytes, chunk: int = 7, limit: int = 1 << 20, **kw: Any) -> Upload:
    storage = FileStorage(tmp_path)

    async def run() -> Upload:
        return await receive_upload(request(body, chunk, **kw), storage, "alice", limit)

    return anyio.run(run)


def leftovers(tmp_path: Path) -> list[str]:
    folder = tmp_path / "files" / "alice"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def refused(tmp_path: Path, body: bytes, **kw: Any) -> UploadRefused:
    with pytest.raises(UploadRefused) as info:
        receive(tmp_path, body, **kw)
    assert leftovers(tmp_path) == []  # nothing stays, whatever refused it
    return info.value
