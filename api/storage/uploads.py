"""Receiving an upload: a multipart/form-data body streamed to disk, never held whole in memory.

Starlette's form parser (FastAPI's `UploadFile`) spools a file part into the system's temporary
folder, keeping its first megabyte in memory, and only hands it over once the whole body is in.
Here python-multipart's streaming parser is fed `request.stream()` directly: the `file` part goes,
in pieces of at most FLUSH_BYTES, into a temporary file in its destination folder
(`pdppo.files.UploadWriter`, written from a worker thread), hashed and counted on the way, so that
the finished file is renamed into place atomically and a file past the limit is refused as soon as
it passes it, with nothing left on disk.

The form: `file` (required, the JSONL content) and `purpose` (optional text, informational). Any
other field, a second `file`, or a malformed `purpose` is a 422 naming the field, in the API's
`ValidationErrorBody` shape; a body that is not multipart at all is a 400.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect

from core.disk.storage import is_no_space
from pdppo.files import FileStorage, FileTooLarge, UploadWriter

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks

FORM_OVERHEAD_BYTES = 1 << 20
"""Body bytes allowed beyond the file's own: boundaries, part headers, the `purpose` field."""
FLUSH_BYTES = 1 << 20
"""File bytes gathered in memory before a write to disk (from a worker thread)."""
MAX_FIELD_BYTES = 1024
"""Longest text field (`purpose`); far above its pattern's 64 characters, so the message says
what is wrong with it rather than that it is long."""
DRAIN_BYTES = 16 << 20
"""After refusing an upload part-way, read (and drop) at most this much more of the body before
answering: a client still sending must get the answer, not a reset connection."""
PURPOSE_PATTERN = r"^[A-Za-z0-9_.\-]{1,64}$"
MAX_FILENAME_CHARS = 255
DEFAULT_FILENAME = "upload.jsonl"
FIELDS = ("file", "purpose")

UPLOAD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["file"],
    "additionalProperties": False,
    "properties": {
        "file": {
            "type": "string",
            "format": "binary",
            "description": (
                'the dataset: UTF-8 JSONL, one record per line, `{"prompt": ...}` or '
                '`{"messages": [...]}` plus any fields the grader reads; at most '
                "PDPPO_MAX_FILE_BYTES"
            ),
        },
        "purpose": {
            "type": "string",
            "pattern": PURPOSE_PATTERN,
            "description": 'what the file is for, e.g. "train" or "validation" (informational)',
        },
    },
}
"""The request body as `/openapi.json` documents it (the route reads the stream itself)."""


class UploadRefused(Exception):
    """A refused upload: the status, `detail`, and for a 422 the field-by-field `errors`."""

    def __init__(
        self, status: int, detail: str, errors: list[dict[str, Any]] | None = None
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.errors = errors or []

    def response(self) -> JSONResponse:
        body: dict[str, Any] = {"detail": self.detail}
        if self.status == 422:
            body["errors"] = self.errors
        return JSONResponse(body, status_code=self.status)


def field_error(name: str, message: str, kind: str) -> UploadRefused:
    """A 422 for one form field, `errors` located like FastAPI's: `["body", name]`."""
    return UploadRefused(
        422, f"{name}: {message}", [{"loc": ["body", name], "msg": message, "type": kind}]
    )


@dataclass
class Upload:
    """A received upload: its content in a temporary file (not yet in place) and its fields."""

    writer: UploadWriter
    filename: str
    purpose: str | None

    @property
    def sha256(self) -> str:
        return self.writer.sha256


@dataclass
class _Part:
    name: str = ""
    filename: str | None = None
    headers: dict[str, bytes] = field(default_factory=dict)
    header_field: bytearray = field(default_factory=bytearray)
    header_value: bytearray = field(default_factory=bytearray)
    text: bytearray = field(default_factory=bytearray)


class _Form:
    """The parser's callbacks: they only sort bytes into the file buffer and the text fields
    (no I/O: the parser runs on the event loop, and the buffer is written out between chunks)."""

    def __init__(self, max_file_bytes: int) -> None:
        self.max_file_bytes = max_file_bytes
        self.part = _Part()
        self.seen: set[str] = set()
        self.file_bytes = 0
        self.filename = DEFAULT_FILENAME
        self.purpose: bytes | None = None
        self.pending = bytearray()
        self.ended = False

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": self._header_field,
            "on_header_value": self._header_value,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
            "on_end": self._end,
        }

    def _part_begin(self) -> None:
        self.part = _Part()

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self.part.header_field += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self.part.header_value += data[start:end]

    def _header_end(self) -> None:
        name = bytes(self.part.header_field).decode("latin-1").strip().lower()
        self.part.headers[name] = bytes(self.part.header_value)
        self.part.header_field.clear()
        self.part.header_value.clear()

    def _headers_finished(self) -> None:
        disposition, options = parse_options_header(self.part.headers.get("content-disposition"))
        raw_name = options.get(b"name")
        if disposition != b"form-data" or raw_name is None:
            raise UploadRefused(
                400, 'every part of the form needs `Content-Disposition: form-data; name="..."`'
            )
        name = raw_name.decode("utf-8", "replace")
        if name.startswith("expires_after"):  # OpenAI's form sends expires_after[anchor] ...
            raise field_error(
                "expires_after",
                "not supported: pdppo keeps a file until it is deleted "
                "(DELETE /v1/files/{id}); leave `expires_after` out",
                "extra",
            )
        if name not in FIELDS:
            shown = name[:64]
            raise field_error(
                shown, f"unknown field {shown!r}; the form takes `file` and `purpose`", "extra"
            )
        if name in self.seen:
            raise field_error(name, "given more than once", "duplicate")
        self.seen.add(name)
        self.part.name = name
        raw_filename = options.get(b"filename")
        if name == "file" and raw_filename is not None:
            self.filename = clean_filename(raw_filename.decode("utf-8", "replace"))

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self.part.name == "file":
            self.file_bytes += end - start
            if self.file_bytes > self.max_file_bytes:
                raise FileTooLarge(self.max_file_bytes)
            self.pending += data[start:end]
        else:
            self.part.text += data[start:end]
            if len(self.part.text) > MAX_FIELD_BYTES:
                raise field_error(
                    self.part.name, f"longer than {MAX_FIELD_BYTES} bytes", "string_too_long"
                )

    def _part_end(self) -> None:
        if self.part.name == "purpose":
            self.purpose = bytes(self.part.text)

    def _end(self) -> None:
        self.ended = True


def clean_filename(name: str) -> str:
    """The upload's file name as shown back: its last path component, without control
    characters, at most MAX_FILENAME_CHARS. Never used on disk (files are stored by sha256)."""
    base = re.split(r"[/\\]", name)[-1]
    base = "".join(c for c in base if unicodedata.category(c) != "Cc").strip()
    return base[:MAX_FILENAME_CHARS] or DEFAULT_FILENAME


def _purpose(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    if not re.fullmatch(PURPOSE_PATTERN, text):
        raise field_error(
            "purpose",
            "must be 1 to 64 letters, digits, '_', '.' or '-' (e.g. train, validation)",
            "string_pattern_mismatch",
        )
    return text


def _boundary(request: Request) -> bytes:
    kind, params = parse_options_header(request.headers.get("content-type"))
    boundary = params.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise UploadRefused(
            400,
            "the body must be multipart/form-data (with a boundary) holding the field `file`",
        )
    return boundary


async def receive_upload(
    request: Request, storage: FileStorage, tenant: str, max_file_bytes: int
) -> Upload:
    """The upload of `request` in a temporary file of `tenant`'s folder, finished and hashed.

    UploadRefused (400, 413, 422) when the body is not a valid upload form or the file is past
    `max_file_bytes`, 507 when the disk fills up; whatever was written is removed first,
    whatever went wrong (a refused form, a dropped connection, the body limit of
    `api.http.limits`, a full disk)."""
    boundary = _boundary(request)
    try:
        writer = await anyio.to_thread.run_sync(storage.new_upload, tenant, max_file_bytes)
    except OSError as exc:
        if is_no_space(exc):
            raise no_room() from None
        raise
    form = _Form(max_file_bytes)
    parser = MultipartParser(boundary, callbacks=form.callbacks())

    async def flush() -> None:
        if form.pending:
            data = bytes(form.pending)
            form.pending.clear()
            await anyio.to_thread.run_sync(writer.write, data)

    try:
        async for chunk in request.stream():
            parser.write(chunk)
            if len(form.pending) >= FLUSH_BYTES:
                await flush()
        parser.finalize()
        await flush()
        if not form.ended:
            raise UploadRefused(400, "the multipart body ended before its closing boundary")
        if "file" not in form.seen:
            raise field_error("file", "the form has no `file` field (the dataset)", "missing")
        purpose = _purpose(form.purpose)
        await anyio.to_thread.run_sync(writer.finish)
    except BaseException as exc:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(writer.discard)
        if isinstance(exc, FileTooLarge):
            raise UploadRefused(413, f"file: {exc}") from None
        if isinstance(exc, FormParserError):
            raise UploadRefused(400, f"the multipart body is malformed: {exc}") from None
        if isinstance(exc, ClientDisconnect):  # nobody reads the answer; no error to log
            raise UploadRefused(400, "the client disconnected before the upload ended") from None
        if isinstance(exc, OSError) and is_no_space(exc):
            raise no_room() from None
        raise
    return Upload(writer, form.filename, purpose)


def no_room(detail: str = "") -> UploadRefused:
    """507: the server's disk has no room for the file (nothing of it is kept). The detail
    names no server path: the folder is the operator's business, not the tenant's."""
    return UploadRefused(
        507,
        detail
        or (
            "file: the server has no room left to store it (its disk filled up during the "
            "upload; nothing was kept); try again later, or ask the operator to free space"
        ),
    )


async def drain(request: Request, limit: int = DRAIN_BYTES) -> None:
    """Reads and drops what is left of the body (at most `limit` bytes), so that a client still
    sending reads the error it is about to get instead of a reset. Stops at the body limit."""
    read = 0
    try:
        async for chunk in request.stream():
            read += len(chunk)
            if read > limit:
                return
    except (HTTPException, ClientDisconnect, RuntimeError, OSError):
        # past the body limit (api.http.limits), the stream already consumed, or the client gone
        return
