"""The upload form's edge cases, each with its exact answer: the status, the `detail` and the
`errors` a client shows (a part without a name, an unknown or repeated field, a purpose at the
length limit or not UTF-8, a malformed body, a client that hangs up, an empty file, a file bigger
than one flush), and what `drain` reads of a refused body. Found by the mutation run of
`api/storage/uploads.py` (bench/mutation.toml, group "uploads"): these lines had no test that told a
changed rule from the right one."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from starlette.requests import Request
from starlette.types import Message

from api.storage.uploads import (
    DEFAULT_FILENAME,
    FLUSH_BYTES,
    MAX_FIELD_BYTES,
    UploadRefused,
    drain,
    field_error,
    receive_upload,
)
from pdppo.files import FileStorage
from tests.api.forms import BOUNDARY, DATA, form, leftovers, receive, refused

PURPOSE_RULE = "must be 1 to 64 letters, digits, '_', '.' or '-' (e.g. train, validation)"


def raw_part(disposition: str, content: bytes) -> bytes:
    return (
        f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n".encode()
        + content
        + (f"\r\n--{BOUNDARY}--\r\n".encode())
    )


def test_a_part_without_a_name_or_not_form_data_is_400(tmp_path: Path) -> None:
    rule = 'every part of the form needs `Content-Disposition: form-data; name="..."`'
    for disposition in ['form-data; filename="a.jsonl"', 'attachment; name="file"']:
        error = refused(tmp_path, raw_part(disposition, DATA))
        assert (error.status, error.detail, error.errors) == (400, rule, [])


def test_an_unknown_field_is_named_cut_to_64_characters(tmp_path: Path) -> None:
    name = "m" * 100
    error = refused(tmp_path, form(("file", "a", DATA), (name, None, b"x")))
    shown = "m" * 64
    message = f"unknown field {shown!r}; the form takes `file` and `purpose`"
    assert (error.status, error.detail) == (422, f"{shown}: {message}")
    assert error.errors == [{"loc": ["body", shown], "msg": message, "type": "extra"}]


def test_a_field_given_twice_is_422_naming_it(tmp_path: Path) -> None:
    error = refused(tmp_path, form(("file", "a", DATA), ("file", "b", DATA)))
    assert (error.status, error.detail) == (422, "file: given more than once")
    assert error.errors == [
        {"loc": ["body", "file"], "msg": "given more than once", "type": "duplicate"}
    ]
    twice = refused(tmp_path, form(("purpose", None, b"a"), ("purpose", None, b"b")))
    assert twice.errors[0]["loc"] == ["body", "purpose"]


def test_the_missing_file_is_422_naming_it(tmp_path: Path) -> None:
    error = refused(tmp_path, form(("purpose", None, b"train")))
    message = "the form has no `file` field (the dataset)"
    assert (error.status, error.detail) == (422, f"file: {message}")
    assert error.errors == [{"loc": ["body", "file"], "msg": message, "type": "missing"}]


def test_the_purpose_at_and_past_its_byte_limit(tmp_path: Path) -> None:
    at = refused(tmp_path, form(("file", "a", DATA), ("purpose", None, b"p" * MAX_FIELD_BYTES)))
    assert (at.status, at.detail) == (422, f"purpose: {PURPOSE_RULE}")
    assert at.errors == [
        {"loc": ["body", "purpose"], "msg": PURPOSE_RULE, "type": "string_pattern_mismatch"}
    ]
    past = refused(
        tmp_path, form(("file", "a", DATA), ("purpose", None, b"p" * (MAX_FIELD_BYTES + 1)))
    )
    assert past.detail == f"purpose: longer than {MAX_FIELD_BYTES} bytes"
    assert past.errors[0]["type"] == "string_too_long"
    not_utf8 = refused(tmp_path, form(("file", "a", DATA), ("purpose", None, b"tr\xc3in")))
    assert not_utf8.errors[0]["type"] == "string_pattern_mismatch"
    assert receive(tmp_path, form(("file", "a", DATA), ("purpose", None, b"p" * 64))).purpose == (
        "p" * 64
    )


def test_no_filename_and_no_purpose(tmp_path: Path) -> None:
    upload = receive(tmp_path, form(("file", None, DATA)))
    assert (upload.filename, upload.purpose) == (DEFAULT_FILENAME, None)
    named = receive(tmp_path, form(("file", "", DATA), ("purpose", None, b"train")))
    assert (named.filename, named.purpose) == (DEFAULT_FILENAME, "train")


def test_an_empty_file_part_is_received_empty(tmp_path: Path) -> None:
    """Emptiness is the route's to refuse (no records: 422); the reader keeps the 0 bytes."""
    upload = receive(tmp_path, form(("file", "e.jsonl", b"")))
    assert (upload.writer.size, upload.sha256) == (0, hashlib.sha256(b"").hexdigest())
    assert upload.writer.path.read_bytes() == b""


@pytest.mark.parametrize("chunk", [FLUSH_BYTES - 1, 65536])
def test_a_file_bigger_than_a_flush_arrives_whole(tmp_path: Path, chunk: int) -> None:
    data = b'{"prompt": "1=", "answer": "1"}\n' * (2 * FLUSH_BYTES // 32 + 7)
    upload = receive(
        tmp_path, form(("file", "big.jsonl", data)), chunk=chunk, limit=4 * FLUSH_BYTES
    )
    assert upload.writer.size == len(data)
    assert upload.sha256 == hashlib.sha256(data).hexdigest()


def test_a_malformed_body_is_400(tmp_path: Path) -> None:
    body = f"--{BOUNDARY}\r\nContent-Disposition form-data\r\n\r\nx".encode()  # no colon
    error = refused(tmp_path, body)
    assert error.status == 400
    assert error.detail.startswith("the multipart body is malformed: ")


def test_a_boundary_missing_from_the_content_type_is_400(tmp_path: Path) -> None:
    error = refused(tmp_path, form(("file", "a", DATA)), content_type="multipart/form-data")
    detail = "the body must be multipart/form-data (with a boundary) holding the field `file`"
    assert (error.status, error.detail) == (400, detail)


def disconnecting(body: bytes) -> Request:
    """A request whose client hangs up after the first half of the body."""
    messages: list[Message] = [
        {"type": "http.request", "body": body[: len(body) // 2], "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> Message:
        return messages.pop(0)

    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": "/v1/files",
        "headers": [(b"content-type", f"multipart/form-data; boundary={BOUNDARY}".encode())],
    }
    return Request(scope, receive)


def test_a_client_that_hangs_up_is_400_with_nothing_kept(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path)

    async def run() -> None:
        await receive_upload(disconnecting(form(("file", "a", DATA))), storage, "alice", 1 << 20)

    with pytest.raises(UploadRefused) as info:
        anyio.run(run)
    detail = "the client disconnected before the upload ended"
    assert (info.value.status, info.value.detail) == (400, detail)
    assert leftovers(tmp_path) == []


def test_the_json_answer_has_errors_only_for_a_422() -> None:
    unprocessable = field_error("file", "holds no records", "empty_file").response()
    assert unprocessable.status_code == 422
    assert json.loads(bytes(unprocessable.body)) == {
        "detail": "file: holds no records",
        "errors": [{"loc": ["body", "file"], "msg": "holds no records", "type": "empty_file"}],
    }
    bad = UploadRefused(400, "not a form").response()
    assert (bad.status_code, json.loads(bytes(bad.body))) == (400, {"detail": "not a form"})


def counted(chunks: list[bytes]) -> tuple[Request, list[int]]:
    """A request of these body chunks, and the list of how many `receive` calls it answered."""
    calls = [0]

    async def receive() -> Message:
        calls[0] += 1
        i = calls[0] - 1
        return {"type": "http.request", "body": chunks[i], "more_body": i < len(chunks) - 1}

    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": "/", "headers": []}
    return Request(scope, receive), calls


def test_drain_reads_the_rest_of_the_body_up_to_its_limit() -> None:
    whole, whole_calls = counted([b"x" * 10] * 5)
    anyio.run(drain, whole)
    assert whole_calls == [5]  # all of it, under the default 16 MiB

    capped, capped_calls = counted([b"x" * 10] * 5)
    anyio.run(drain, capped, 25)
    assert capped_calls == [3]  # 30 bytes read is past 25: it stops there

    exact, exact_calls = counted([b"x" * 10] * 5)
    anyio.run(drain, exact, 30)
    assert exact_calls == [4]  # 30 is not past 30

    anyio.run(drain, disconnecting(b"x" * 20))  # a client gone mid-body: it returns, no error
