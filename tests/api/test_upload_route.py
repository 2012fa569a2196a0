"""`POST /v1/files` in-process (the real app over ASGI, a real redis-server): the form's own
limits as the route applies them, an empty file, and two tenants sending the same bytes under
the same file name. Faster than a started server, so the mutation runs of
`api/storage/uploads.py` and `api/routes/files.py` can afford it."""

from __future__ import annotations

from api.openai.errors import error_body
from api.storage.uploads import FORM_OVERHEAD_BYTES
from pdppo.settings import Settings
from tests.support.inprocess import LINE, MAX_FILE, call, native, upload


def test_the_body_limit_is_the_file_limit_plus_the_form_overhead(settings: Settings) -> None:
    """The body limit of `/v1/files` is PDPPO_MAX_FILE_BYTES plus FORM_OVERHEAD_BYTES (1 MiB):
    a file of exactly PDPPO_MAX_FILE_BYTES, with its form around it, is stored; one byte more is
    the file's 413; a body past the file and the overhead is refused by its declared length,
    before it is read."""
    exact = LINE * 300
    body_limit = MAX_FILE + FORM_OVERHEAD_BYTES
    at, past, huge = call(
        settings,
        ("alice", "/v1/files", upload(exact, purpose="train")),
        ("alice", "/v1/files", upload(exact + b"\n")),
        ("alice", "/v1/files", upload(b"x" * (body_limit - 100))),  # the form passes the limit
    )
    assert at.status_code == 201, at.text
    assert (at.json()["bytes"], at.json()["records"], at.json()["purpose"]) == (
        MAX_FILE,
        300,
        "train",
    )
    assert past.status_code == 413
    too_big = f"file: larger than the limit of {MAX_FILE} bytes (PDPPO_MAX_FILE_BYTES)"
    assert past.json() == {"detail": too_big, **error_body(413, too_big)}
    assert huge.status_code == 413
    over = f"request body is larger than the limit of {body_limit} bytes"
    assert huge.json() == {"detail": over, **error_body(413, over)}  # the body limit's, too
    assert body_limit == MAX_FILE + (1 << 20)


def test_an_empty_file_is_422_and_bad_forms_answer_their_bodies(settings: Settings) -> None:
    empty, no_file, twice = call(
        settings,
        ("alice", "/v1/files", upload(b"")),
        ("alice", "/v1/files", {"data": {"purpose": "train"}, "files": {"other": ("x", b"1")}}),
        (
            "alice",
            "/v1/files",
            {"files": [("file", ("a", LINE)), ("file", ("b", LINE))]},
        ),
    )
    assert empty.status_code == 422
    assert empty.json()["errors"] == [
        {"loc": ["body", "file"], "msg": "holds no records", "type": "empty_file"}
    ]
    assert no_file.status_code == 422
    assert no_file.json()["errors"][0]["loc"] == ["body", "other"]
    assert twice.status_code == 422
    assert native(twice) == {
        "detail": "file: given more than once",
        "errors": [{"loc": ["body", "file"], "msg": "given more than once", "type": "duplicate"}],
    }
    (listing,) = call(settings, ("alice", "/v1/files", {}))
    assert listing.json() == {
        "items": [],
        "next_cursor": None,
        "object": "list",
        "data": [],
        "has_more": False,
        "first_id": None,
        "last_id": None,
    }


def test_two_tenants_uploading_the_same_bytes_and_name_each_get_their_own_file(
    settings: Settings,
) -> None:
    """Files are stored per tenant by content: the same bytes under the same (client-chosen)
    name are two files, each tenant's own, on disk under each tenant's folder."""
    a, b, again = call(
        settings,
        ("alice", "/v1/files", upload(LINE, "../shared.jsonl", purpose="train")),
        ("bob", "/v1/files", upload(LINE, "../shared.jsonl", purpose="eval")),
        ("alice", "/v1/files", upload(LINE, "other.jsonl")),
    )
    assert (a.status_code, b.status_code, again.status_code) == (201, 201, 200)
    assert a.json()["id"] == b.json()["id"]  # the id is the content's
    assert (a.json()["filename"], b.json()["filename"]) == ("shared.jsonl", "shared.jsonl")
    assert (a.json()["purpose"], b.json()["purpose"]) == ("train", "eval")
    assert again.json() == a.json()  # alice's first upload, not a second file
    sha = a.json()["sha256"]
    for tenant in ("alice", "bob"):
        assert (settings.artifact_dir / "files" / tenant / f"{sha}.jsonl").read_bytes() == LINE
    assert not (settings.artifact_dir / "shared.jsonl").exists()
    alice_list, bob_list = call(settings, ("alice", "/v1/files", {}), ("bob", "/v1/files", {}))
    assert [f["purpose"] for f in alice_list.json()["items"]] == ["train"]
    assert [f["purpose"] for f in bob_list.json()["items"]] == ["eval"]


def test_the_storage_quota_to_the_byte_and_each_tenants_usage(settings: Settings) -> None:
    """PDPPO_MAX_STORAGE_BYTES_PER_TENANT: an upload that takes the tenant exactly to its quota
    is stored, one byte more is 507 ("would pass"), and a tenant at its quota is refused
    whatever it sends ("at least"); the other tenant's usage and uploads are its own."""
    quota = 34 * 10
    settings = settings.model_copy(update={"max_storage_bytes_per_tenant": quota})
    first, over, to_quota, at_quota, other, usage, bob_usage = call(
        settings,
        ("alice", "/v1/files", upload(LINE * 4)),
        ("alice", "/v1/files", upload(LINE * 5 + b"\n" * 35)),  # 136 + 205: 1 byte over
        ("alice", "/v1/files", upload(LINE * 5 + b"\n" * 34)),  # 136 + 204 = 340, the quota
        ("alice", "/v1/files", upload(b'{"prompt": "x"}\n')),
        ("bob", "/v1/files", upload(LINE * 4)),
        ("alice", "/v1/usage", {}),
        ("bob", "/v1/usage", {}),
    )
    assert (first.status_code, to_quota.status_code, other.status_code) == (201, 201, 201)
    tail = (
        "its storage quota of 340 bytes (PDPPO_MAX_STORAGE_BYTES_PER_TENANT): delete jobs "
        "(pdppo delete ID) or files (pdppo files delete ID) first"
    )
    assert over.status_code == 507
    assert native(over) == {
        "detail": "tenant 'alice' keeps 136 bytes (136 of uploaded files, 0 of job artifacts); "
        f"this upload would pass {tail}"
    }
    assert at_quota.status_code == 507
    assert native(at_quota) == {
        "detail": "tenant 'alice' keeps 340 bytes (340 of uploaded files, 0 of job artifacts); "
        f"that is at least {tail}"
    }
    body = usage.json()
    assert (body["tenant"], body["files"], body["bytes"], body["quota_bytes"]) == (
        "alice",
        2,
        {"files": 340, "artifacts": 0, "total": 340},
        340,
    )
    assert body["jobs"] == dict.fromkeys(
        ["queued", "running", "paused", "succeeded", "failed", "cancelled"], 0
    )
    assert (bob_usage.json()["files"], bob_usage.json()["bytes"]["total"]) == (1, 136)
