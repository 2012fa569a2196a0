"""Uploads without the server: the streaming form reader over real ASGI messages cut anywhere,
the line check against the record schema, the files folder, and a job's own links to its files."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from api.storage.uploads import clean_filename
from core.config import TaskConfig
from pdppo.files import (
    FileStorage,
    FileTooLarge,
    InputFileError,
    describe_problems,
    file_id_of,
    inspect_jsonl,
    job_input_files,
    spec_file_ids,
    tenant_dir_name,
)
from tests.api.forms import DATA, form, receive, refused


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_the_file_part_arrives_whole_however_the_body_is_cut(tmp_path: Path, chunk: int) -> None:
    body = form(("purpose", None, b"validation"), ("file", "dir/../data.jsonl", DATA))
    upload = receive(tmp_path, body, chunk)
    assert upload.writer.path.read_bytes() == DATA  # a boundary look-alike inside is data
    assert upload.sha256 == hashlib.sha256(DATA).hexdigest()
    assert upload.writer.size == len(DATA)
    assert (upload.filename, upload.purpose) == ("data.jsonl", "validation")
    assert upload.writer.path.parent == tmp_path / "files" / "alice"  # renamed in place later
    assert upload.writer.path.name.startswith(".upload-")


def test_a_file_past_the_limit_is_refused_and_removed(tmp_path: Path) -> None:
    error = refused(tmp_path, form(("file", "a", DATA)), limit=len(DATA) - 1)
    assert error.status == 413
    assert error.detail == f"file: larger than the limit of {len(DATA) - 1} bytes " + (
        "(PDPPO_MAX_FILE_BYTES)"
    )
    assert receive(tmp_path, form(("file", "a", DATA)), limit=len(DATA)).writer.size == len(DATA)


def test_bad_forms_name_the_field(tmp_path: Path) -> None:
    missing = refused(tmp_path, form(("purpose", None, b"train")))
    assert (missing.status, missing.errors[0]["loc"]) == (422, ["body", "file"])
    twice = refused(tmp_path, form(("file", "a", DATA), ("file", "b", DATA)))
    assert (twice.status, twice.errors[0]["type"]) == (422, "duplicate")
    extra = refused(tmp_path, form(("file", "a", DATA), ("model", None, b"x")))
    assert extra.errors[0]["loc"] == ["body", "model"]
    purpose = refused(tmp_path, form(("file", "a", DATA), ("purpose", None, b"a b")))
    assert purpose.errors[0]["loc"] == ["body", "purpose"]
    long = refused(tmp_path, form(("file", "a", DATA), ("purpose", None, b"p" * 2000)))
    assert long.errors[0]["type"] == "string_too_long"
    cut = refused(tmp_path, form(("file", "a", DATA))[:-10])
    assert cut.status == 400 and "closing boundary" in cut.detail
    plain = refused(tmp_path, DATA, content_type="application/json")
    assert plain.status == 400 and "multipart/form-data" in plain.detail


def test_file_names_are_shown_clean() -> None:
    assert clean_filename("C:\\data\\train.jsonl") == "train.jsonl"
    assert clean_filename("../../etc/passwd") == "passwd"
    assert clean_filename("a\x00b\nc.jsonl") == "abc.jsonl"
    assert clean_filename("dir/") == "upload.jsonl"
    assert len(clean_filename("x" * 1000)) == 255


def test_every_line_is_checked_and_the_first_bad_ones_reported(tmp_path: Path) -> None:
    long_line = b'{"prompt": "' + b"y" * 100 + b'"}'
    lines = [
        b'{"prompt": "a", "answer": 1}',  # 1
        b"",  # 2: blank, skipped
        b"[1, 2]",  # 3
        b'{"prompt": "\xc3"}',  # 4: not UTF-8
        long_line,  # 5: longer than the limit below
        b'{"messages": [{"role": "user", "content": "hi"}], "answer": "yo"}\r',  # 6
        b'{"prompt": "b", "answer": true}',  # 7
        b'{"prompt": "c"}',  # 8, no newline at the end
    ]
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\n".join(lines))
    found = inspect_jsonl(path, max_line_bytes=80)
    assert (found.records, found.bad_lines, found.ok) == (3, 4, False)
    assert [p.line for p in found.problems] == [3, 4, 5, 7]
    assert found.problems[0].message == "a record is a JSON object, not an array"
    assert found.problems[1].message.startswith("the line is not UTF-8")
    assert found.problems[2].message == "the line is longer than the limit of 80 bytes"
    assert "'answer' must be a string or a number" in found.problems[3].message

    first_two = inspect_jsonl(path, max_line_bytes=80, limit=2)
    assert first_two.bad_lines == 4 and [p.line for p in first_two.problems] == [3, 4]
    assert describe_problems(first_two).startswith("file: 4 lines are not valid records: line 3")
    assert describe_problems(first_two).endswith("; and 2 more")
    assert inspect_jsonl(path).bad_lines == 3  # line 5 is fine under the default 1 MiB


def test_the_files_folder(tmp_path: Path) -> None:
    storage = FileStorage(tmp_path)
    upload = storage.new_upload("alice", max_bytes=10)
    upload.write(b"0123456789")
    with pytest.raises(FileTooLarge):
        upload.write(b"!")
    sha = upload.finish()
    assert sha == hashlib.sha256(b"0123456789").hexdigest()
    assert file_id_of(sha) == "file-" + sha[:32]
    target = storage.put("alice", upload)
    assert target == tmp_path / "files" / "alice" / f"{sha}.jsonl"
    upload.discard()  # once in place, discarding leaves it
    assert target.read_bytes() == b"0123456789"

    stale, fresh = storage.new_upload("alice", 10), storage.new_upload("alice", 10)
    old = time.time() - 2 * 24 * 3600
    os.utime(stale.path, (old, old))
    assert storage.remove_stale_uploads("alice") == 1
    assert not stale.path.exists() and fresh.path.exists() and target.exists()
    storage.remove("alice", sha)
    assert not target.exists()
    assert tenant_dir_name("..") == "%2E%2E" and tenant_dir_name("a.b") == "a.b"
    assert storage.tenant_dir(".").parent == tmp_path / "files"


def test_a_job_links_its_files_and_keeps_them(tmp_path: Path) -> None:
    store = tmp_path / "store.jsonl"
    store.write_bytes(DATA)
    task = TaskConfig(name="jsonl", file="file-" + "a" * 32, validation_file="file-" + "b" * 32)
    named = spec_file_ids(task)
    assert named == [
        ("train.task.file", "file-" + "a" * 32),
        ("train.task.validation_file", "file-" + "b" * 32),
    ]
    job_dir = tmp_path / "job"
    paths = job_input_files(named, job_dir, lambda _: store)
    own = job_dir / "inputs" / f"file-{'a' * 32}.jsonl"
    assert paths["file-" + "a" * 32] == own
    assert os.stat(own).st_ino == os.stat(store).st_ino  # a hard link, not a copy
    store.unlink()  # the file is deleted: a resumed run still has its own link
    assert job_input_files(named, job_dir, lambda _: None) == paths
    assert own.read_bytes() == DATA

    with pytest.raises(InputFileError) as gone:
        job_input_files(named, tmp_path / "other", lambda _: None)
    assert str(gone.value).startswith(f"train.task.file: file 'file-{'a' * 32}' no longer exists")
    with pytest.raises(InputFileError):  # a record, but its file vanished in between
        job_input_files(named, tmp_path / "third", lambda _: tmp_path / "missing.jsonl")
    assert list((tmp_path / "third" / "inputs").iterdir()) == []
