"""The Files API on the real stack: upload a JSONL dataset over HTTP, list, get, read, delete;
tenants apart; the same content stored once; bad lines and oversized files refused with nothing
left on disk; quotas; a job spec naming a file by id, refused when the tenant has no such file,
trained on a real worker when it has, failed with `invalid_input` when the file went before the
job started."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import redis

from api.openai.errors import error_body
from tests.support.files import file_id, upload
from tests.support.specs import jsonl_spec, records
from tests.support.stack import Service
from tests.support.waits import wait_status

TERMINAL = {"succeeded", "failed", "cancelled"}


def stored(service: Service, tenant: str = "alice") -> list[str]:
    """Every entry of the tenant's files folder (temporary upload files included)."""
    folder = service.artifact_dir / "files" / tenant
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_upload_list_get_content_and_delete(service: Service, alice: httpx.Client) -> None:
    train, held_out = records(40, "t"), records(8, "v")
    created = upload(alice, train, "train.jsonl", purpose="train")
    assert created.status_code == 201, created.text
    body = created.json()
    sha = hashlib.sha256(train).hexdigest()
    assert body["id"] == f"file-{sha[:32]}" == file_id(train)
    assert (body["filename"], body["bytes"], body["records"]) == ("train.jsonl", len(train), 40)
    assert (body["sha256"], body["purpose"]) == (sha, "train")
    assert created.headers["location"] == f"/v1/files/{body['id']}"
    validation = upload(alice, held_out, "val.jsonl", purpose="validation").json()
    assert validation["records"] == 8 and validation["purpose"] == "validation"

    listed = alice.get("/v1/files", params={"limit": 100}).json()["items"]
    ids = [f["id"] for f in listed]
    assert ids.index(validation["id"]) < ids.index(body["id"])  # newest first
    assert alice.get(f"/v1/files/{body['id']}").json() == body
    content = alice.get(f"/v1/files/{body['id']}/content")
    assert content.status_code == 200 and content.content == train
    assert content.headers["content-type"].startswith("application/x-ndjson")
    assert f"{sha}.jsonl" in stored(service)

    assert alice.delete(f"/v1/files/{body['id']}").status_code == 200
    assert alice.get(f"/v1/files/{body['id']}").status_code == 404
    assert alice.get(f"/v1/files/{body['id']}/content").status_code == 404
    assert alice.delete(f"/v1/files/{body['id']}").status_code == 404
    assert body["id"] not in [f["id"] for f in alice.get("/v1/files").json()["items"]]
    assert f"{sha}.jsonl" not in stored(service)
    assert alice.delete(f"/v1/files/{validation['id']}").status_code == 200


def test_pages_walk_every_file_once(alice: httpx.Client) -> None:
    made = [upload(alice, records(2, f"p{i}-")).json()["id"] for i in range(5)]
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = alice.get("/v1/files", params=params).json()
        seen += [f["id"] for f in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [i for i in seen if i in made] == made[::-1]
    assert len(seen) == len(set(seen))
    for i in made:
        alice.delete(f"/v1/files/{i}")


def test_another_tenant_cannot_see_read_or_delete_a_file(
    service: Service, alice: httpx.Client, bob: httpx.Client
) -> None:
    content = records(3, "secret")
    mine = upload(alice, content).json()["id"]
    for method, path in [
        ("GET", f"/v1/files/{mine}"),
        ("GET", f"/v1/files/{mine}/content"),
        ("DELETE", f"/v1/files/{mine}"),
    ]:
        response = bob.request(method, path)
        assert response.status_code == 404, (method, path, response.text)
        gone = f"file {mine!r} not found"
        assert response.json() == {"detail": gone, **error_body(404, gone)}
    assert mine not in [f["id"] for f in bob.get("/v1/files").json()["items"]]
    # the same bytes are bob's own file under the same id; deleting his leaves alice's alone
    theirs = upload(bob, content)
    assert theirs.status_code == 201 and theirs.json()["id"] == mine
    assert bob.delete(f"/v1/files/{mine}").status_code == 200
    assert alice.get(f"/v1/files/{mine}/content").content == content
    alice.delete(f"/v1/files/{mine}")


def test_the_same_content_twice_is_one_file_on_disk(service: Service, alice: httpx.Client) -> None:
    content = records(5, "twice")
    first = upload(alice, content, "a.jsonl", purpose="train")
    again = upload(alice, content, "b.jsonl")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()  # the file already there: its name, time, purpose
    sha = first.json()["sha256"]
    assert [n for n in stored(service) if n.startswith(sha)] == [f"{sha}.jsonl"]
    assert not [n for n in stored(service) if n.endswith(".part")]
    alice.delete(f"/v1/files/{first.json()['id']}")


def test_racing_uploads_and_deletes_keep_records_and_disk_in_step(
    service: Service, alice: httpx.Client
) -> None:
    """Uploads of one content at once make one file (one 201); a delete racing an upload of the
    same content never leaves a record without its file, nor a file without its record."""
    content = records(300, "race")
    fid, path = file_id(content), f"{hashlib.sha256(content).hexdigest()}.jsonl"
    with ThreadPoolExecutor(8) as pool:
        statuses = sorted(pool.map(lambda _: upload(alice, content).status_code, range(8)))
        assert statuses == [200] * 7 + [201]
        assert [n for n in stored(service) if n == path or n.endswith(".part")] == [path]
        for _ in range(6):
            deleting = pool.submit(alice.delete, f"/v1/files/{fid}")
            uploading = pool.submit(upload, alice, content)
            assert deleting.result().status_code in (200, 404)
            assert uploading.result().status_code in (200, 201)
            listed = alice.get(f"/v1/files/{fid}").status_code == 200
            assert listed == (path in stored(service)), (listed, stored(service))
    alice.delete(f"/v1/files/{fid}")


def test_a_bad_line_is_refused_by_number_and_nothing_is_stored(
    service: Service, alice: httpx.Client
) -> None:
    good = records(2).decode()
    content = (
        good + '{"prompt": "no answer is fine"}\n' + "\n" + "{not json\n" + '{"answer": "4"}\n'
    ).encode() + b'{"prompt": "\xff"}\n'
    before = stored(service)
    response = upload(alice, content)
    assert response.status_code == 422, response.text
    body = response.json()
    assert set(body) == {"detail", "errors", "error"}  # `error`: OpenAI's, for its SDK
    assert body["error"]["param"] == "file.line.5"
    assert [e["loc"] for e in body["errors"]] == [
        ["body", "file", "line", 5],
        ["body", "file", "line", 6],
        ["body", "file", "line", 7],
    ]
    assert body["errors"][0]["msg"].startswith("not JSON")
    assert "exactly one of 'prompt'" in body["errors"][1]["msg"]
    assert "not UTF-8" in body["errors"][2]["msg"]
    assert body["detail"].startswith("file: 3 lines are not valid records: line 5: not JSON")
    assert "line 6: " in body["detail"] and "line 7: " in body["detail"]
    assert stored(service) == before
    assert file_id(content) not in [f["id"] for f in alice.get("/v1/files").json()["items"]]

    empty = upload(alice, b"\n\n")
    assert empty.status_code == 422
    assert empty.json()["errors"] == [
        {"loc": ["body", "file"], "msg": "holds no records", "type": "empty_file"}
    ]


def test_malformed_forms_are_refused_with_the_field(alice: httpx.Client) -> None:
    plain = alice.post("/v1/files", content=b'{"prompt": "x"}\n')
    assert plain.status_code == 400 and "multipart/form-data" in plain.json()["detail"]
    missing = alice.post("/v1/files", files={"purpose": (None, "train")})
    assert missing.status_code == 422
    assert missing.json()["errors"][0]["loc"] == ["body", "file"]
    extra = alice.post("/v1/files", files={"file": ("a", records(1)), "other": (None, "x")})
    assert extra.status_code == 422 and extra.json()["errors"][0]["loc"] == ["body", "other"]
    bad_purpose = upload(alice, records(1), purpose="not a purpose!")
    assert bad_purpose.status_code == 422
    assert bad_purpose.json()["errors"][0]["loc"] == ["body", "purpose"]
    unauthenticated = httpx.post(
        f"{alice.base_url}/v1/files", files={"file": ("a", records(1))}, timeout=10
    )
    assert unauthenticated.status_code == 401


def _chunks(content: bytes, size: int) -> Iterator[bytes]:
    for start in range(0, len(content), size):
        yield content[start : start + size]


def _multipart(content: bytes, boundary: str = "pdppo-test-boundary") -> tuple[bytes, str]:
    head = (
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="file"; filename="big.jsonl"\r\n'
        "Content-Type: application/x-ndjson\r\n\r\n"
    ).encode()
    return head + content + f"\r\n--{boundary}--\r\n".encode(), boundary


def test_files_past_the_limits_get_413_or_429_and_leave_nothing(
    make_service: Callable[..., Service],
) -> None:
    """A file over PDPPO_MAX_FILE_BYTES: 413 whether the body says its length (refused before it
    is read) or is sent chunked (refused as soon as the count passes the limit), and no file,
    temporary or not, stays. Quotas: bytes per tenant (413), files per tenant (429)."""
    service = make_service(
        PDPPO_MAX_FILE_BYTES="20000",
        PDPPO_MAX_FILES_PER_TENANT="2",
        PDPPO_MAX_FILE_BYTES_PER_TENANT="30000",
    )
    service.start_api()
    with service.client("alice") as alice:
        big = records(1000)  # 37 kB
        assert len(big) > 20000
        declared = upload(alice, big)
        assert declared.status_code == 413, declared.text
        assert "PDPPO_MAX_FILE_BYTES" in declared.json()["detail"]
        body, boundary = _multipart(big)
        chunked = alice.post(
            "/v1/files",
            content=_chunks(body, 4096),  # no Content-Length: the route counts
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        )
        assert chunked.status_code == 413, chunked.text
        assert chunked.json()["detail"] == (
            "file: larger than the limit of 20000 bytes (PDPPO_MAX_FILE_BYTES)"
        )
        huge = upload(alice, b"x" * (2 << 20))  # past the body limit of the middleware too
        assert huge.status_code == 413
        assert stored(service) == []

        first = upload(alice, records(400, "a"))  # 14.8 kB
        assert first.status_code == 201, first.text
        over_bytes = upload(alice, records(500, "b"))  # 14.8 + 18.5 > 30 kB
        assert over_bytes.status_code == 413
        assert "PDPPO_MAX_FILE_BYTES_PER_TENANT" in over_bytes.json()["detail"]
        second = upload(alice, records(10, "c"))
        assert second.status_code == 201
        third = upload(alice, records(10, "d"))
        assert third.status_code == 429, third.text
        assert "PDPPO_MAX_FILES_PER_TENANT" in third.json()["detail"]
        assert len(stored(service)) == 2
        assert alice.delete(f"/v1/files/{second.json()['id']}").status_code == 200
        assert upload(alice, records(10, "d")).status_code == 201


def test_a_job_naming_a_file_the_tenant_has_not_got_is_422(
    alice: httpx.Client, bob: httpx.Client
) -> None:
    unknown = "file-" + "0" * 32
    response = alice.post("/v1/jobs", json=jsonl_spec(unknown))
    assert response.status_code == 422, response.text
    assert response.json()["detail"] == (
        f"train.task.file: file {unknown!r} not found; upload it first (POST /v1/files)"
    )
    bobs = upload(bob, records(4, "bob")).json()["id"]
    theirs = alice.post("/v1/jobs", json=jsonl_spec(bobs))
    assert theirs.status_code == 422 and "train.task.file" in theirs.json()["detail"]
    mine = upload(alice, records(4, "alice")).json()["id"]
    validation = alice.post("/v1/jobs:validate", json=jsonl_spec(mine, validation_file=unknown))
    assert validation.status_code == 200
    problems = validation.json()["problems"]
    assert [(p["field"], p["kind"]) for p in problems] == [("train.task.validation_file", "file")]
    bob.delete(f"/v1/files/{bobs}")
    alice.delete(f"/v1/files/{mine}")


def test_a_job_trains_on_uploaded_files_and_keeps_them_when_deleted(
    service: Service, alice: httpx.Client
) -> None:
    train = upload(alice, records(32, "r"), purpose="train").json()
    held_out = upload(alice, records(8, "h"), purpose="validation").json()
    response = alice.post("/v1/jobs", json=jsonl_spec(train["id"], held_out["id"]))
    assert response.status_code == 201, response.text
    job = wait_status(alice, response.json()["id"], TERMINAL, timeout=180)
    assert job["status"] == "succeeded", (job, service.worker_log()[-3000:])
    assert job["progress"]["step"] == 3

    inputs = service.artifact_dir / job["id"] / "inputs"
    own = inputs / f"{train['id']}.jsonl"
    shared = service.artifact_dir / "files" / "alice" / f"{train['sha256']}.jsonl"
    assert os.stat(own).st_ino == os.stat(shared).st_ino  # a link, no copy
    assert (inputs / f"{held_out['id']}.jsonl").read_bytes() == records(8, "h")
    for f in (train, held_out):
        assert alice.delete(f"/v1/files/{f['id']}").status_code == 200
    assert not shared.exists()
    assert own.read_bytes() == records(32, "r")  # the job's own link outlives the file


def test_a_queued_job_whose_file_was_deleted_fails_with_invalid_input(
    make_service: Callable[..., Service],
) -> None:
    service = make_service()
    service.start_api()
    with service.client("alice") as alice:
        file = upload(alice, records(16)).json()["id"]
        job = alice.post("/v1/jobs", json=jsonl_spec(file)).json()
        assert job["status"] == "queued"
        assert alice.delete(f"/v1/files/{file}").status_code == 409  # the job names it
        # A delete in the instant between a submit's check and its job: the record goes.
        store = redis.Redis.from_url(service.redis_url)
        try:
            assert store.delete(f"pdppo:tenant:alice:file:{file}") == 1
        finally:
            store.close()
        service.start_worker("cpu")  # only now: the job starts after its file is gone
        done = wait_status(alice, job["id"], TERMINAL, timeout=120)
    assert done["status"] == "failed", done
    assert done["error"] == {
        "code": "invalid_input",
        "message": (
            f"train.task.file: file {file!r} no longer exists (deleted after the job was "
            "queued); upload it again and submit a new job"
        ),
    }


def test_the_files_operations_document_their_statuses(service: Service) -> None:
    schema = httpx.get(f"{service.base_url}/openapi.json", timeout=30).json()
    upload_op = schema["paths"]["/v1/files"]["post"]
    assert {"200", "201", "400", "401", "413", "422", "429", "500", "503"} <= set(
        upload_op["responses"]
    )
    form = upload_op["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert form["required"] == ["file"] and form["properties"]["file"]["format"] == "binary"
    for path in ("/v1/files/{file_id}", "/v1/files/{file_id}/content"):
        assert "404" in schema["paths"][path]["get"]["responses"]
    assert "404" in schema["paths"]["/v1/files/{file_id}"]["delete"]["responses"]
    content = schema["paths"]["/v1/files/{file_id}/content"]["get"]["responses"]["200"]
    assert list(content["content"]) == ["application/x-ndjson"]
