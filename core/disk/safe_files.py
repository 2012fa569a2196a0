"""Reading the local files a job spec names (datasets, model folders) without letting one spec
take the worker down or read what it must not.

A path under a data root can still be a FIFO (`open()` blocks forever), a device (`/dev/zero`
never ends), a socket, a directory, a symlink that leads out of the root (to another tenant's
artifacts), or a 50 GB file with no newline. So:

- symlinks are resolved (`os.path.realpath`) *before* the real path is checked against the data
  roots, and on Linux the opened descriptor's path is checked again (`/proc/self/fd`), so a
  symlink swapped in between the check and the `open` is caught too;
- only regular files are opened: a `stat` first (which never blocks, whatever the file is), then
  `open` with `O_NONBLOCK` (a FIFO that appears in between cannot block it) and `fstat` of the
  descriptor, and only then is `O_NONBLOCK` cleared for ordinary reads;
- datasets have a size limit and are read as a stream of lines of bounded length: at most about
  `max_line_bytes` are ever held for one line, whatever the file holds.

`data_roots=None` means no root restriction (a local `pdppo train` reads what its user can);
an empty list means no local file may be read at all. Core code gets the roots as an argument:
it never reads the service's settings.
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import BinaryIO, Literal

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_LINE_BYTES",
    "DEFAULT_MAX_TREE_ENTRIES",
    "UnsafeFileError",
    "check_model_dir",
    "is_hub_id",
    "iter_lines",
    "open_regular_file",
    "path_problem",
]

DEFAULT_MAX_BYTES = 1 << 30
"""Largest dataset file read (1 GiB): far above any prompt set, far below a worker's memory."""

DEFAULT_MAX_LINE_BYTES = 1 << 20
"""Longest line of a dataset (1 MiB, newline excluded); a longer one is refused, never buffered."""

DEFAULT_MAX_TREE_ENTRIES = 100_000
"""Most entries checked in a model folder (a sharded checkpoint has hundreds, not thousands)."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


class UnsafeFileError(ValueError):
    """A local path a spec names that the trainer refuses to read; the message names it and why."""


def is_hub_id(name: str) -> bool:
    """True when `name` has the shape of a Hugging Face hub id (`gpt2`, `org/name`).

    A hub id is not a path; but the same string can also name a folder relative to the current
    directory, which is why the worker refuses such a name when that folder exists there.
    """
    return bool(_HUB_ID.match(name)) and ".." not in name


def _is_within(real: str, real_root: str) -> bool:
    return os.path.commonpath([real, real_root]) == real_root


def _root_problem(path: str, data_roots: Sequence[str] | None) -> str | None:
    """Why `path` is not readable under `data_roots`, symlinks resolved; None when it is."""
    if data_roots is None:
        return None
    if not data_roots:
        return "local paths are disabled on this server (its data roots are empty)"
    if not os.path.isabs(path):
        return f"must be an absolute path under one of {list(data_roots)}"
    real = os.path.realpath(path)
    if any(_is_within(real, os.path.realpath(root)) for root in data_roots):
        return None
    if any(_is_within(os.path.normpath(path), os.path.normpath(root)) for root in data_roots):
        return f"leads outside the data roots {list(data_roots)} through a symlink"
    return f"is not under any of the allowed data roots {list(data_roots)}"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "not a regular file"


def _type_problem(
    st: os.stat_result, want: Literal["file", "dir"], max_bytes: int | None
) -> str | None:
    if want == "dir":
        return None if stat.S_ISDIR(st.st_mode) else f"is {_kind(st.st_mode)}, not a directory"
    if not stat.S_ISREG(st.st_mode):
        return f"is {_kind(st.st_mode)}, not a regular file"
    if max_bytes is not None and st.st_size > max_bytes:
        return f"is {st.st_size} bytes, larger than the limit of {max_bytes} bytes"
    return None


def path_problem(
    path: str,
    data_roots: Sequence[str] | None,
    *,
    want: Literal["file", "dir"] = "file",
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> str | None:
    """Why the trainer would refuse to read `path` (a phrase such as "is a FIFO, not a regular
    file"), or None. Only `stat`s: cheap, never blocks; the API uses it at submit time on paths
    its host can see. A model folder's contents are checked by `check_model_dir`."""
    why = _root_problem(path, data_roots)
    if why:
        return why
    try:
        st = os.stat(os.path.realpath(path))
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    return _type_problem(st, want, max_bytes if want == "file" else None)


def _fd_path_problem(fd: int, data_roots: Sequence[str] | None) -> str | None:
    """The root check once more, on what was actually opened (Linux: /proc/self/fd)."""
    if data_roots is None:
        return None
    try:
        opened = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None  # no /proc: the check before opening stands alone
    if any(_is_within(opened, os.path.realpath(root)) for root in data_roots):
        return None
    return f"leads outside the data roots {list(data_roots)} (it changed while being opened)"


@contextmanager
def open_regular_file(
    path: str | os.PathLike[str],
    data_roots: Sequence[str] | None = None,
    *,
    what: str | None = None,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> Iterator[BinaryIO]:
    """A binary file object for `path`, only if it is a regular file of at most `max_bytes`
    whose real path lies under `data_roots`; otherwise `UnsafeFileError` saying why.

    `what` starts the error message (e.g. "task.path='/data/x.jsonl'"); default: the path.
    """
    path = os.fspath(path)
    what = what or repr(path)
    why = path_problem(path, data_roots, want="file", max_bytes=max_bytes)
    if why:
        raise UnsafeFileError(f"{what} {why}")
    real = os.path.realpath(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(real, flags)
    except OSError as exc:
        raise UnsafeFileError(f"{what} cannot be opened ({exc.strerror})") from exc
    try:
        why = _type_problem(os.fstat(fd), "file", max_bytes) or _fd_path_problem(fd, data_roots)
        if why:
            raise UnsafeFileError(f"{what} {why}")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f


def iter_lines(
    path: str | os.PathLike[str],
    data_roots: Sequence[str] | None = None,
    *,
    what: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> Iterator[tuple[int, str]]:
    """(line number, text without its newline) for each line of a UTF-8 text file opened with
    `open_regular_file`. A line longer than `max_line_bytes` is refused after reading at most
    `max_line_bytes + 1` bytes of it; a file that grows past `max_bytes` while read is refused."""
    what = what or repr(os.fspath(path))
    with open_regular_file(path, data_roots, what=what, max_bytes=max_bytes) as f:
        total = 0
        lineno = 0
        while True:
            raw = f.readline(max_line_bytes + 1)  # bounded: never more than this in memory
            if not raw:
                return
            lineno += 1
            total += len(raw)
            if total > max_bytes:
                raise UnsafeFileError(f"{what} grew past the limit of {max_bytes} bytes")
            if not raw.endswith(b"\n") and len(raw) > max_line_bytes:
                raise UnsafeFileError(
                    f"{what} line {lineno} is longer than the limit of {max_line_bytes} bytes"
                )
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UnsafeFileError(f"{what} line {lineno} is not UTF-8 ({exc.reason})") from exc
            yield lineno, text.rstrip("\r\n")


def check_model_dir(
    path: str,
    data_roots: Sequence[str] | None = None,
    *,
    what: str | None = None,
    max_entries: int = DEFAULT_MAX_TREE_ENTRIES,
) -> str:
    """The real path of the model folder `path`, after checking that it and everything in it
    (followed through symlinks, each resolved against the roots) is a directory or a regular
    file: `from_pretrained` opens files by name and would block on a FIFO or read a device
    forever. No size limit: model weights are as large as they are. Raises `UnsafeFileError`."""
    what = what or repr(path)
    why = path_problem(path, data_roots, want="dir")
    if why:
        raise UnsafeFileError(f"{what} {why}")
    real = os.path.realpath(path)
    top = os.stat(real)
    seen = {(top.st_dev, top.st_ino)}
    pending = [real]
    entries = 0
    while pending:
        folder = pending.pop()
        try:
            listing = list(os.scandir(folder))
        except OSError as exc:
            raise UnsafeFileError(f"{what} cannot be listed ({exc.strerror})") from exc
        for entry in listing:
            entries += 1
            if entries > max_entries:
                raise UnsafeFileError(f"{what} holds more than {max_entries} files")
            inner = os.path.relpath(entry.path, real)
            if entry.is_symlink():
                why = _root_problem(entry.path, data_roots)
                if why:
                    raise UnsafeFileError(f"{what} holds {inner!r}, which {why}")
            try:
                st = os.stat(entry.path)  # follows symlinks; never blocks
            except OSError as exc:
                raise UnsafeFileError(
                    f"{what} holds {inner!r}, which cannot be read ({exc.strerror})"
                ) from exc
            if stat.S_ISDIR(st.st_mode):
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    pending.append(entry.path)
            elif not stat.S_ISREG(st.st_mode):
                raise UnsafeFileError(
                    f"{what} holds {inner!r}, which is {_kind(st.st_mode)}, not a regular file"
                )
    return real
