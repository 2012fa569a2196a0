"""Uploaded datasets on disk: where they live, how an upload is written, checked and put in place,
and how a job gets its own copy.

Layout: `<artifact_dir>/files/<tenant>/<sha256>.jsonl`, one file per distinct content per tenant
(the API and the workers share the artifact store already, for checkpoints). The file's Redis
record (`pdppo.store.files`) is the truth: listing and reading trust it, never the folder.

Crash safety comes from the order of writes, not from transactions across Redis and the disk:

- an upload streams into a temporary file *in the destination folder* (`.upload-*.part`),
  hashing and counting as it goes, is checked line by line from there, fsynced, and renamed into
  place atomically; only then is its record written. A crash before the record leaves an orphan
  file that nothing lists, and the next upload of the same content renames over it;
- a delete removes the record first, then the file: a crash in between leaves the same
  harmless orphan;
- temporary files of uploads that died are removed by later uploads once a day old.

A job never reads the shared copy while it trains: at start the worker hard-links each file the
spec names into the job's own folder (`<job dir>/inputs/<file id>.jsonl`). A file deleted after
that stays readable by the job (and by its resumes) and is freed when the job's folder goes; one
deleted before the job started fails the job with `invalid_input` (`InputFileError`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from core.config import TaskConfig
from core.disk.safe_files import DEFAULT_MAX_LINE_BYTES
from core.tasks.records import MAX_REPORTED_PROBLEMS, LineProblem, find_problems

log = logging.getLogger(__name__)
FILES_DIR = "files"
TEMP_PREFIX = ".upload-"
TEMP_SUFFIX = ".part"
STALE_UPLOAD_SECONDS = 24 * 3600
"""A temporary upload file this old belongs to an upload that died (no upload lasts a day)."""
INPUTS_DIR = "inputs"


def file_id_of(sha256: str) -> str:
    """`file-` and the first 32 hex digits of the sha256 (`core.config.task.FILE_ID_RE`)."""
    return "file-" + sha256[:32]


def tenant_dir_name(tenant: str) -> str:
    """The tenant's folder name. Tenant names are `[A-Za-z0-9_.-]{1,64}` (`pdppo.settings`), so
    only `.` and `..` could escape the files folder; their dots are written `%2E`, which no
    other tenant name can contain."""
    return tenant.replace(".", "%2E") if tenant in (".", "..") else tenant


class FileTooLarge(Exception):
    """The upload passed the per-file limit; nothing of it is kept."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"larger than the limit of {limit} bytes (PDPPO_MAX_FILE_BYTES)")
        self.limit = limit


class UploadWriter:
    """A temporary file in the destination folder, hashed and counted as it is written.

    Blocking calls (file writes): run them in a worker thread from async code."""

    def __init__(self, folder: Path, max_bytes: int) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{TEMP_PREFIX}{secrets.token_hex(8)}{TEMP_SUFFIX}"
        self.max_bytes = max_bytes
        self.size = 0
        self._hash = hashlib.sha256()
        self._fh: BinaryIO | None = self.path.open("xb")
        self._done = False

    def write(self, data: bytes) -> None:
        """Appends `data`; FileTooLarge as soon as the file would pass `max_bytes` (what was
        written stays until `discard`)."""
        if self.size + len(data) > self.max_bytes:
            raise FileTooLarge(self.max_bytes)
        assert self._fh is not None, "write after finish"
        self._fh.write(data)
        self._hash.update(data)
        self.size += len(data)

    def finish(self) -> str:
        """Flushes the file to disk (fsync: its record may point at it right after) and returns
        the content's sha256."""
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            self._fh = None
        return self._hash.hexdigest()

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    def moved(self) -> None:
        """The file was renamed into place: `discard` must not remove it any more."""
        self._done = True

    def discard(self) -> None:
        """Closes and removes the temporary file, unless it was moved; safe to call twice.

        Never raises: it runs while the upload's own error is on its way up, and on a full disk
        the close itself fails (flushing what is buffered), yet the file must still go."""
        fh, self._fh = self._fh, None
        if fh is not None:
            try:
                fh.close()  # closes the descriptor even when the flush before it fails
            except OSError as exc:
                log.warning("closing %s failed (%s); removing it anyway", self.path, exc)
        if not self._done:
            try:
                self.path.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("could not remove %s: %s", self.path, exc)
            self._done = True


class FileStorage:
    """The folder of uploaded files: `<artifact_dir>/files/<tenant>/<sha256>.jsonl`."""

    def __init__(self, artifact_dir: Path) -> None:
        self.root = artifact_dir / FILES_DIR

    def tenant_dir(self, tenant: str) -> Path:
        return self.root / tenant_dir_name(tenant)

    def path(self, tenant: str, sha256: str) -> Path:
        return self.tenant_dir(tenant) / f"{sha256}.jsonl"

    def new_upload(self, tenant: str, max_bytes: int) -> UploadWriter:
        return UploadWriter(self.tenant_dir(tenant), max_bytes)

    def put(self, tenant: str, upload: UploadWriter) -> Path:
        """Renames the finished upload into place (replacing an orphan of the same content, which
        holds the same bytes) and makes the rename durable before a record points at it."""
        target = self.path(tenant, upload.sha256)
        os.replace(upload.path, target)
        upload.moved()
        _fsync_dir(target.parent)
        return target

    def remove(self, tenant: str, sha256: str) -> None:
        self.path(tenant, sha256).unlink(missing_ok=True)

    def remove_stale_uploads(self, tenant: str, older_than: float = STALE_UPLOAD_SECONDS) -> int:
        """Deletes the temporary files of uploads that died (a crash, a killed API) at least
        `older_than` seconds ago; returns how many."""
        folder = self.tenant_dir(tenant)
        cutoff = time.time() - older_than
        removed = 0
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            return 0
        for entry in entries:
            if not (entry.name.startswith(TEMP_PREFIX) and entry.name.endswith(TEMP_SUFFIX)):
                continue
            with contextlib.suppress(FileNotFoundError):
                if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(entry.path)
                    removed += 1
        return removed


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- checking an upload ------------------------------------------------------------------------


@dataclass
class Inspection:
    """What checking a JSONL file found: its records, and its first bad lines (all counted)."""

    records: int = 0
    bad_lines: int = 0
    problems: list[LineProblem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.bad_lines == 0 and self.records > 0


def _lines(
    fh: BinaryIO, max_line_bytes: int, unreadable: list[LineProblem]
) -> Iterator[tuple[int, str]]:
    """The file's lines as text, as a worker reads them (`core.disk.safe_files.iter_lines`: UTF-8,
    at most `max_line_bytes` each), but a line the worker would stop at (too long, not UTF-8)
    goes to `unreadable` and the reading goes on, so that an upload is told every bad line."""
    lineno = 0
    while True:
        raw = fh.readline(max_line_bytes + 1)  # bounded: never more than this in memory
        if not raw:
            return
        lineno += 1
        if not raw.endswith(b"\n") and len(raw) > max_line_bytes:
            unreadable.append(
                LineProblem(lineno, f"the line is longer than the limit of {max_line_bytes} bytes")
            )
            while raw and not raw.endswith(b"\n"):  # skip the rest of it, a piece at a time
                raw = fh.readline(max_line_bytes + 1)
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            unreadable.append(LineProblem(lineno, f"the line is not UTF-8 ({exc.reason})"))
            continue
        yield lineno, text.rstrip("\r\n")


def inspect_jsonl(
    path: Path,
    *,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    limit: int = MAX_REPORTED_PROBLEMS,
) -> Inspection:
    """Checks every line of `path` against the dataset record schema (`core.tasks.records`),
    the same rules the worker applies when it loads the file; blank lines are skipped."""
    unreadable: list[LineProblem] = []
    with path.open("rb") as fh:
        problems, bad, records = find_problems(_lines(fh, max_line_bytes, unreadable), limit)
    merged = sorted([*problems, *unreadable], key=lambda p: p.line)[:limit]
    return Inspection(records=records, bad_lines=bad + len(unreadable), problems=merged)


def describe_problems(inspection: Inspection) -> str:
    """One line for a 422's `detail`: how many lines are bad, and the first of them."""
    if inspection.bad_lines == 0:
        return "file: holds no records (it is empty, or every line is blank)"
    shown = "; ".join(f"line {p.line}: {p.message}" for p in inspection.problems)
    more = inspection.bad_lines - len(inspection.problems)
    tail = f"; and {more} more" if more > 0 else ""
    noun = "line is" if inspection.bad_lines == 1 else "lines are"
    return f"file: {inspection.bad_lines} {noun} not valid records: {shown}{tail}"


# --- a job's own copy of its files -------------------------------------------------------------


class InputFileError(ValueError):
    """A file the job's spec names is gone (deleted after the job was queued): the job fails
    with `invalid_input`, and the message says which field and what to do."""


def spec_file_ids(task: TaskConfig) -> list[tuple[str, str]]:
    """(spec field, file id) for each uploaded file the task names."""
    named = [("train.task.file", task.file), ("train.task.validation_file", task.validation_file)]
    return [(where, file_id) for where, file_id in named if file_id is not None]


def job_input_files(
    file_ids: Iterable[tuple[str, str]],
    job_dir: Path,
    locate: Callable[[str], Path | None],
) -> dict[str, Path]:
    """The job's copy of each file, by id: `<job_dir>/inputs/<file id>.jsonl`, hard-linked from
    the store (no bytes copied; a copy where the store is on another device).

    `locate(file_id)` is where the store keeps the file, or None when it has no record of it.
    A copy made by an earlier run of the job is used as it is, whatever happened to the file
    since: the job read it when it started, and a resumed job must train on the same data."""
    inputs = job_dir / INPUTS_DIR
    out: dict[str, Path] = {}
    for where, file_id in file_ids:
        if file_id in out:
            continue
        own = inputs / f"{file_id}.jsonl"
        if not own.is_file():
            source = locate(file_id)
            gone = InputFileError(
                f"{where}: file {file_id!r} no longer exists (deleted after the job was "
                "queued); upload it again and submit a new job"
            )
            if source is None:
                raise gone
            inputs.mkdir(parents=True, exist_ok=True)
            try:
                _link_or_copy(source, own)
            except FileNotFoundError:  # deleted between the record read and the link
                raise gone from None
        out[file_id] = own
    return out


def _link_or_copy(source: Path, target: Path) -> None:
    partial = target.with_name(f"{target.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")
    try:
        try:
            os.link(source, partial)
        except FileNotFoundError:
            raise
        except OSError:  # another device, or links not allowed there
            shutil.copyfile(source, partial)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
