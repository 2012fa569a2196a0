"""The client's file methods and `pdppo files ...` against the real stack, and the spec paths the
client resolves."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from pdppo.cli import main
from pdppo.client import ApiError, Client, resolve_spec_paths

GOOD = b'{"prompt": "12=", "answer": "21"}\n{"prompt": "34=", "answer": "43"}\n'
BAD = b'{"prompt": "12=", "answer": "21"}\n{"prompt": 5}\n'


def _run(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, args, env=env, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_client_file_methods(client: Client, tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    path.write_bytes(GOOD + b'{"prompt": "client"}\n')
    made = client.upload_file(path, purpose="train")
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert (made.id, made.sha256, made.created) == (f"file-{sha[:32]}", sha, True)
    assert (made.filename, made.records, made.bytes, made.purpose) == (
        "train.jsonl",
        3,
        path.stat().st_size,
        "train",
    )
    again = client.upload_file(path)
    assert again.id == made.id and again.created is False
    assert made.id in [f.id for f in client.iter_files()]
    assert client.get_file(made.id).sha256 == sha
    assert client.file_content(made.id) == path.read_bytes()
    saved = client.download_file(made.id, tmp_path)
    assert saved == tmp_path / f"{made.id}.jsonl" and saved.read_bytes() == path.read_bytes()
    client.delete_file(made.id)
    with pytest.raises(ApiError) as missing:
        client.get_file(made.id)
    assert missing.value.status_code == 404

    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(BAD)
    with pytest.raises(ApiError) as refused:
        client.upload_file(bad)
    assert refused.value.status_code == 422
    assert "line 2: 'prompt' must be a string, not a number" in str(refused.value)


def test_the_client_still_pages_and_deletes_files(client: Client, tmp_path: Path) -> None:
    """`GET /v1/files` also answers OpenAI's list fields, `DELETE` a 200 with OpenAI's object
    (it was 204): pdppo's client pages by `cursor` and deletes as before."""
    ids = []
    for i in range(3):
        path = tmp_path / f"page{i}.jsonl"
        path.write_bytes(GOOD + json.dumps({"prompt": f"page {i} {time.time_ns()}"}).encode())
        ids.append(client.upload_file(path).id)
    first = client.list_files(limit=2)
    assert [f.id for f in first.items] == [ids[2], ids[1]] and first.next_cursor
    second = client.list_files(limit=2, cursor=first.next_cursor)
    assert second.items[0].id == ids[0]
    assert client.delete_file(ids[1]) is None
    assert [f.id for f in client.iter_files(page_size=1) if f.id in ids] == [ids[2], ids[0]]
    with pytest.raises(ApiError) as gone:
        client.delete_file(ids[1])
    assert (gone.value.status_code, gone.value.detail) == (404, f"file {ids[1]!r} not found")
    for file_id in (ids[0], ids[2]):
        client.delete_file(file_id)


def test_files_commands(cli_env: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "cli.jsonl"
    path.write_bytes(GOOD + b'{"prompt": "cli"}\n')
    code, out, err = _run(["files", "upload", str(path), "--purpose", "validation"], cli_env)
    assert code == 0, err
    file_id = out.strip()
    assert file_id == "file-" + hashlib.sha256(path.read_bytes()).hexdigest()[:32]
    assert err.strip() == f"3 records, {path.stat().st_size} bytes"
    code, _, err = _run(["files", "upload", str(path)], cli_env)
    assert code == 0 and "already uploaded" in err

    code, out, _ = _run(["files", "list"], cli_env)
    line = next(row for row in out.splitlines() if row.startswith(file_id))
    assert "validation" in line and "cli.jsonl" in line
    code, out, _ = _run(["files", "list", "--json"], cli_env)
    assert file_id in [json.loads(row)["id"] for row in out.splitlines()]
    code, out, _ = _run(["files", "show", file_id], cli_env)
    assert json.loads(out)["records"] == 3
    code, out, _ = _run(["files", "download", file_id], cli_env)
    assert out.encode() == path.read_bytes()
    code, _, err = _run(["files", "download", file_id, "-o", str(tmp_path / "copy.jsonl")], cli_env)
    assert code == 0 and (tmp_path / "copy.jsonl").read_bytes() == path.read_bytes()

    code, out, _ = _run(["files", "delete", file_id], cli_env)
    assert code == 0 and out.strip() == f"{file_id} deleted"
    code, _, err = _run(["files", "show", file_id], cli_env)
    assert code == 2 and "HTTP 404" in err and "not found" in err

    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(BAD)
    code, _, err = _run(["files", "upload", str(bad)], cli_env)
    assert code == 2 and "HTTP 422" in err and "line 2:" in err
    assert len(err.strip().splitlines()) == 1


def test_validation_paths_are_resolved_like_the_dataset(tmp_path: Path) -> None:
    spec = {
        "train": {
            "task": {
                "name": "jsonl",
                "path": "data/train.jsonl",
                "validation_path": "data/val.jsonl",
            }
        }
    }
    task = resolve_spec_paths(spec, tmp_path)["train"]["task"]
    assert task["path"] == str(tmp_path / "data" / "train.jsonl")
    assert task["validation_path"] == str(tmp_path / "data" / "val.jsonl")
    by_id = {"train": {"task": {"name": "jsonl", "file": "file-" + "0" * 32}}}
    assert resolve_spec_paths(by_id, tmp_path) == by_id  # ids are not paths
