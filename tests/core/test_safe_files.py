"""core.disk.safe_files: a path under a data root can still be a FIFO, a device, a socket, a symlink
out of the root or a huge file with no newline; none of them may block, exhaust or leak."""

from __future__ import annotations

import os
import socket
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import core.disk.safe_files as safe_files
from core.disk.safe_files import (
    UnsafeFileError,
    check_model_dir,
    is_hub_id,
    iter_lines,
    open_regular_file,
    path_problem,
)
from core.models.hf import resolve_hf_source


def finishes(fn: Callable[[], Any], seconds: float = 10.0) -> Any:
    """fn() run in a thread: a call that blocks (the bug) fails the test instead of hanging it."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "blocked: the call never returned"
    if "error" in box:
        raise box["error"]
    return box.get("value")


@pytest.fixture
def roots(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(data root, a folder outside it standing for another tenant's artifacts)."""
    root = tmp_path / "data"
    other = tmp_path / "artifacts" / "other-tenant"
    root.mkdir()
    other.mkdir(parents=True)
    (other / "secret.jsonl").write_text('{"prompt": "s", "answer": "t"}\n')
    yield root, other


def read_all(
    path: Path,
    data_roots: list[str] | None = None,
    *,
    max_bytes: int = safe_files.DEFAULT_MAX_BYTES,
    max_line_bytes: int = safe_files.DEFAULT_MAX_LINE_BYTES,
) -> list[str]:
    lines = iter_lines(path, data_roots, max_bytes=max_bytes, max_line_bytes=max_line_bytes)
    return [line for _, line in lines]


def test_a_regular_file_under_the_root_reads_line_by_line(roots: tuple[Path, Path]) -> None:
    root, _ = roots
    path = root / "ok.jsonl"
    path.write_bytes(b"one\r\ntwo\n\nthree")
    assert read_all(path, [str(root)]) == ["one", "two", "", "three"]
    assert read_all(path) == ["one", "two", "", "three"]  # no roots: anywhere


def test_a_fifo_is_refused_without_blocking(roots: tuple[Path, Path]) -> None:
    root, _ = roots
    fifo = root / "data.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeFileError, match="is a FIFO, not a regular file"):
        finishes(lambda: read_all(fifo, [str(root)]))
    assert path_problem(str(fifo), [str(root)]) == "is a FIFO, not a regular file"


def test_a_fifo_swapped_in_after_the_stat_still_never_blocks(
    roots: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stat before opening is skipped here (as if the file changed in between): the open
    with O_NONBLOCK and the fstat of the descriptor must catch it on their own."""
    root, _ = roots
    fifo = root / "late.jsonl"
    os.mkfifo(fifo)
    monkeypatch.setattr(safe_files, "path_problem", lambda *a, **k: None)

    def open_it() -> None:
        with open_regular_file(fifo, [str(root)]):
            pass

    with pytest.raises(UnsafeFileError, match="is a FIFO, not a regular file"):
        finishes(open_it)


def test_devices_sockets_and_directories_are_refused(tmp_path: Path) -> None:
    sock_path = tmp_path / "s.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock_path))
    try:
        cases = {
            "/dev/zero": "is a character device, not a regular file",
            str(sock_path): "is a socket, not a regular file",
            str(tmp_path): "is a directory, not a regular file",
        }
        for path, why in cases.items():
            with pytest.raises(UnsafeFileError, match=why):
                finishes(lambda p=path: read_all(Path(p)))  # type: ignore[misc]
    finally:
        server.close()


def test_symlinks_are_resolved_before_the_root_check(roots: tuple[Path, Path]) -> None:
    root, other = roots
    (root / "zero.jsonl").symlink_to("/dev/zero")
    (root / "steal.jsonl").symlink_to(other / "secret.jsonl")
    (root / "tenant").symlink_to(other, target_is_directory=True)
    for name in ("zero.jsonl", "steal.jsonl", "tenant/secret.jsonl"):
        with pytest.raises(UnsafeFileError, match="leads outside the data roots"):
            finishes(lambda n=name: read_all(root / n, [str(root)]))  # type: ignore[misc]
    # a symlink that stays inside the root is fine
    (root / "real.jsonl").write_text("x\n")
    (root / "alias.jsonl").symlink_to(root / "real.jsonl")
    assert read_all(root / "alias.jsonl", [str(root)]) == ["x"]


def test_paths_outside_relative_or_with_no_roots_are_refused(roots: tuple[Path, Path]) -> None:
    root, other = roots
    secret = str(other / "secret.jsonl")
    assert path_problem(secret, [str(root)]) == (
        f"is not under any of the allowed data roots {[str(root)]}"
    )
    escape = f"{root}/../artifacts/other-tenant/secret.jsonl"
    assert "not under any of the allowed data roots" in str(path_problem(escape, [str(root)]))
    assert path_problem("data.jsonl", [str(root)]) == (
        f"must be an absolute path under one of {[str(root)]}"
    )
    assert "local paths are disabled" in str(path_problem(secret, []))


def test_size_limit_is_checked_before_reading(tmp_path: Path) -> None:
    big = tmp_path / "big.jsonl"
    with big.open("wb") as f:
        f.truncate(50 * 2**30)  # 50 GiB, sparse: costs nothing on disk
    with pytest.raises(UnsafeFileError, match=r"is 53687091200 bytes, larger than the limit"):
        read_all(big)


def test_a_huge_file_without_newline_is_refused_after_one_line_limit(tmp_path: Path) -> None:
    """50 GiB of zeros and no newline: refused after reading about max_line_bytes, with memory
    bounded by the line limit, not the file."""
    big = tmp_path / "noline.jsonl"
    with big.open("wb") as f:
        f.truncate(50 * 2**30)
    tracemalloc.start()
    try:
        with pytest.raises(UnsafeFileError, match="line 1 is longer than the limit of 1048576"):
            read_all(big, max_bytes=2**40, max_line_bytes=2**20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20


def test_line_limit_is_exact(tmp_path: Path) -> None:
    path = tmp_path / "lines.txt"
    path.write_bytes(b"a" * 10 + b"\n" + b"b" * 10)
    assert read_all(path, max_line_bytes=10) == ["a" * 10, "b" * 10]
    path.write_bytes(b"a" * 11 + b"\n")
    with pytest.raises(UnsafeFileError, match="line 1 is longer than the limit of 10 bytes"):
        read_all(path, max_line_bytes=10)
    path.write_bytes(b"ok\n" + b"c" * 11)  # the last line, without newline, is checked too
    with pytest.raises(UnsafeFileError, match="line 2 is longer"):
        read_all(path, max_line_bytes=10)


def test_a_file_that_grows_while_read_is_cut_at_the_size_limit(tmp_path: Path) -> None:
    path = tmp_path / "grows.jsonl"
    path.write_bytes(b"first\n")
    lines = iter_lines(path, max_bytes=10)
    assert next(lines) == (1, "first")
    with path.open("ab") as f:
        f.write(b"second line\n")
    with pytest.raises(UnsafeFileError, match="grew past the limit of 10 bytes"):
        list(lines)


def test_non_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "latin.jsonl"
    path.write_bytes(b"fine\ncaf\xe9\n")
    with pytest.raises(UnsafeFileError, match="line 2 is not UTF-8"):
        read_all(path)


def test_model_dir_contents_are_checked(roots: tuple[Path, Path]) -> None:
    root, other = roots
    model = root / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "sub" / "weights.bin").write_bytes(b"\0" * 16)
    (model / "loop").symlink_to(model, target_is_directory=True)  # cycles are walked once
    assert check_model_dir(str(model), [str(root)]) == os.path.realpath(model)
    os.mkfifo(model / "tokenizer.json")
    with pytest.raises(UnsafeFileError, match=r"'tokenizer\.json', which is a FIFO"):
        finishes(lambda: check_model_dir(str(model), [str(root)]))
    os.unlink(model / "tokenizer.json")
    (model / "sub" / "vocab.txt").symlink_to(other / "secret.jsonl")
    with pytest.raises(UnsafeFileError, match=r"'sub/vocab\.txt', which leads outside"):
        check_model_dir(str(model), [str(root)])
    os.unlink(model / "sub" / "vocab.txt")
    (model / "sub" / "zero.bin").symlink_to("/dev/zero")
    with pytest.raises(UnsafeFileError, match=r"zero\.bin"):
        check_model_dir(str(model), None)  # no roots: still no devices
    with pytest.raises(UnsafeFileError, match="is a regular file, not a directory"):
        check_model_dir(str(model / "config.json"), [str(root)])


def test_hub_ids() -> None:
    for name in ("gpt2", "Qwen/Qwen2.5-0.5B", "org/name_v1.2"):
        assert is_hub_id(name), name
    for name in ("/data/m", "./m", "~/m", "../m", "a/b/c", "org/..x", "-x", "a b"):
        assert not is_hub_id(name), name


def test_hf_source_with_data_roots_never_reads_the_working_directory(
    roots: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, other = roots
    data_roots = [str(root)]
    (root / "m").mkdir()
    (root / "out").symlink_to(other, target_is_directory=True)
    monkeypatch.chdir(root.parent)
    (root.parent / "tests" / "core").mkdir(parents=True)
    assert resolve_hf_source("hf:Qwen/Qwen2.5-0.5B", data_roots) == "Qwen/Qwen2.5-0.5B"
    assert resolve_hf_source(f"hf:{root}/m", data_roots) == os.path.realpath(root / "m")
    refused = {
        "hf:tests/core": "names a file relative to the worker's working directory",
        "hf:data/m": "names a file relative to the worker's working directory",
        "hf:./data/m": "must be an absolute path under one of",
        "hf:~/m": "must be an absolute path under one of",
        f"hf:{root}/out": "leads outside the data roots",
        f"hf:{other}": "is not under any of the allowed data roots",
    }
    for name, why in refused.items():
        with pytest.raises(UnsafeFileError, match=why):
            resolve_hf_source(name, data_roots)
        with pytest.raises(UnsafeFileError) as no_roots:
            resolve_hf_source(name, [])  # an empty list: no local path at all
        assert name in str(no_roots.value)


def test_hf_source_without_roots_is_a_local_folder_or_a_hub_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "m").mkdir(parents=True)
    assert resolve_hf_source("hf:models/m") == str((tmp_path / "models" / "m").resolve())
    assert resolve_hf_source("hf:gpt2") == "gpt2"
    with pytest.raises(UnsafeFileError, match="cannot be read"):
        resolve_hf_source("hf:./missing")
