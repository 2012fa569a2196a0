"""More routes in-process (the real app over ASGI, a real redis-server), each with its known
answers: JSON or CSV for a job's evaluations, its samples, pausing a job being cancelled, the
job patch's OpenAPI example, each tenant's job counts and measured bytes (and the cache of that
measure), the upload limits before the body is read and when the file is stored, and two
tenants sending the same Idempotency-Key.
Fast enough for the quick tests of the mutation group "routes" (bench/mutation.toml)."""

from __future__ import annotations

import json
import time

import pytest
import redis

from api.app import create_app
from pdppo.settings import Settings
from pdppo.store.keys import (
    eval_key,
    events_key,
    job_key,
    samples_key,
    tenant_jobs_key,
    tenant_usage_key,
)
from tests.support.inprocess import LINE, native, send, upload
from tests.support.seed import seed_job
from tests.support.specs import smoke_spec


def _client(settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(settings.redis_url, decode_responses=True)


def test_evaluations_are_json_unless_csv_is_asked_for(settings: Settings) -> None:
    """`format` decides; without it, `Accept: text/csv` alone gets CSV and anything else JSON."""
    client = _client(settings)
    seed_job(client, "j-eval", "running", tenant="alice")
    rows = [
        {"step": 2, "metrics": {"eval_reward_mean": 0.5}},
        {"step": 4, "metrics": {"eval_reward_mean": 0.75, "eval_prompts": 8.0}},
    ]
    client.rpush(eval_key("j-eval"), *(json.dumps(r) for r in rows))
    csv_header = {"headers": {"Accept": "text/csv"}}
    plain, by_accept, json_over_accept, by_format, bobs = send(
        settings,
        ("alice", "GET", "/v1/jobs/j-eval/eval", {}),
        ("alice", "GET", "/v1/jobs/j-eval/eval", dict(csv_header)),
        ("alice", "GET", "/v1/jobs/j-eval/eval?format=json", dict(csv_header)),
        ("alice", "GET", "/v1/jobs/j-eval/eval?format=csv", {}),
        ("bob", "GET", "/v1/jobs/j-eval/eval", {}),
    )
    as_json = {"job_id": "j-eval", "items": rows}
    assert (plain.status_code, plain.json()) == (200, as_json)
    assert (json_over_accept.status_code, json_over_accept.json()) == (200, as_json)
    as_csv = "step,eval_prompts,eval_reward_mean\n2,,0.5\n4,8.0,0.75\n"
    for answer in (by_accept, by_format):
        assert answer.status_code == 200
        assert answer.headers["content-type"] == "text/csv; charset=utf-8"
        assert answer.text == as_csv
        assert answer.headers["content-disposition"] == 'attachment; filename="j-eval-eval.csv"'
    assert bobs.status_code == 404


def test_pausing_answers_by_the_jobs_state(settings: Settings) -> None:
    """A job being cancelled is not paused (409, naming the cancel); an ended one is 409; a
    queued one is paused at once; another tenant's is 404."""
    client = _client(settings)
    seed_job(client, "j-cancelling", "running", tenant="alice", cancel_requested="1")
    seed_job(client, "j-done", "succeeded", tenant="alice")
    seed_job(client, "j-queued", "queued", tenant="alice")
    cancelling, done, queued, bobs = send(
        settings,
        ("alice", "POST", "/v1/jobs/j-cancelling/pause", {}),
        ("alice", "POST", "/v1/jobs/j-done/pause", {}),
        ("alice", "POST", "/v1/jobs/j-queued/pause", {}),
        ("bob", "POST", "/v1/jobs/j-queued/pause", {}),
    )
    assert (cancelling.status_code, cancelling.json()) == (
        409,
        {"detail": "job 'j-cancelling' is being cancelled; nothing to pause"},
    )
    assert client.hget(job_key("j-cancelling"), "status") == "running"  # not paused
    assert (done.status_code, done.json()) == (
        409,
        {"detail": "job 'j-done' already succeeded; nothing to pause"},
    )
    assert (queued.status_code, queued.json()["status"]) == (202, "paused")
    assert bobs.status_code == 404


def test_the_job_patchs_openapi_example_is_a_change_the_api_accepts(
    settings: Settings,
) -> None:
    """The example a reader copies from /docs is applied as it stands (a bad example, such as a
    negative `lr`, would be a 422)."""
    app = create_app(settings)
    schema = app.openapi()["components"]["schemas"]["JobPatch"]
    (example,) = schema["properties"]["train"]["examples"]
    client = _client(settings)
    seed_job(client, "j-steer", "running", tenant="alice", spec=json.dumps(smoke_spec()))
    headers = {"Content-Type": "application/merge-patch+json"}
    (patched,) = send(
        settings,
        ("alice", "PATCH", "/v1/jobs/j-steer", {"json": {"train": example}, "headers": headers}),
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["config_version"] == 1
    assert json.loads(client.hget(job_key("j-steer"), "overrides") or "{}") == {"train": example}
    ((_, last),) = client.xrevrange(events_key("j-steer"), count=1)
    assert (last["type"], json.loads(last["data"])["message"]) == (
        "log",
        "config change 1 requested (train.algorithm.delta_high=0.2, train.optim.lr=0.0001); it "
        "applies at the job's next step",
    )


def _job_id(n: int) -> str:
    return f"{n:024x}"  # the form of pdppo.store.keys.new_job_id, which measure() counts


def test_usage_counts_each_tenants_jobs_and_measures_its_bytes_now(
    settings: Settings,
) -> None:
    """`GET /v1/usage` counts the caller's jobs by status (a listed id whose record is gone, as
    in a delete racing it, counts as none) and measures its bytes on disk now; the quota check
    of an upload reads the measure kept from it (PDPPO_USAGE_CACHE_SECONDS) rather than walking
    the tenant's folders on every upload."""
    client = _client(settings)
    statuses = ["queued", "queued", "running", "paused", "succeeded", "succeeded", "succeeded"]
    statuses += ["failed", "cancelled"]
    for n, status in enumerate(statuses):
        seed_job(client, _job_id(n), status, tenant="alice")
    seed_job(client, _job_id(100), "running", tenant="bob")
    client.zadd(tenant_jobs_key("alice"), {_job_id(99): 0})  # listed, its record deleted
    quota = 1000
    settings = settings.model_copy(
        update={"max_storage_bytes_per_tenant": quota, "usage_cache_seconds": 600}
    )
    (before,) = send(settings, ("alice", "GET", "/v1/usage", {}))
    (settings.artifact_dir / _job_id(4)).mkdir()
    (settings.artifact_dir / _job_id(4) / "model.bin").write_bytes(b"m" * quota)  # a worker's
    cached_upload, after, fresh_upload, bobs = send(
        settings,
        ("alice", "POST", "/v1/files", upload(LINE)),  # the quota check's kept measure: 0 bytes
        ("alice", "GET", "/v1/usage", {}),
        ("alice", "POST", "/v1/files", upload(LINE + LINE)),  # measured after the upload
        ("bob", "GET", "/v1/usage", {}),
    )
    counts = {"queued": 2, "running": 1, "paused": 1, "succeeded": 3, "failed": 1, "cancelled": 1}
    assert before.status_code == 200, before.text
    assert (before.json()["jobs"], before.json()["bytes"]) == (
        counts,
        {"files": 0, "artifacts": 0, "total": 0},
    )
    assert cached_upload.status_code == 201, cached_upload.text
    assert after.json()["bytes"] == {"files": 34, "artifacts": quota, "total": quota + 34}
    assert (after.json()["jobs"], after.json()["files"]) == (counts, 1)
    assert fresh_upload.status_code == 507
    assert fresh_upload.json()["detail"].startswith(
        f"tenant 'alice' keeps {quota + 34} bytes (34 of uploaded files, {quota} of job artifacts)"
    )
    zero = dict.fromkeys(counts, 0)
    assert (bobs.json()["jobs"], bobs.json()["bytes"]["total"]) == ({**zero, "running": 1}, 0)


def test_the_tenants_bytes_limit_when_the_file_is_stored(settings: Settings) -> None:
    """PDPPO_MAX_FILE_BYTES_PER_TENANT is checked before the body is read from its declared
    length less the form's framing, which lets a small file through; the store's own check then
    refuses it (413), and its bytes are not kept. The other tenant's limit is its own."""
    settings = settings.model_copy(update={"max_file_bytes_per_tenant": 34 * 3 + 10})
    kept, past, bobs = send(
        settings,
        ("alice", "POST", "/v1/files", upload(LINE * 3)),
        ("alice", "POST", "/v1/files", upload(b'{"prompt": "2+2=", "answer": "4"}\n')),
        ("bob", "POST", "/v1/files", upload(b'{"prompt": "2+2=", "answer": "4"}\n')),
    )
    assert (kept.status_code, bobs.status_code) == (201, 201)
    assert (past.status_code, native(past)) == (
        413,
        {
            "detail": "tenant 'alice' keeps 102 bytes of files; this upload would pass the limit "
            "of 112 (PDPPO_MAX_FILE_BYTES_PER_TENANT): delete some first"
        },
    )
    sha = bobs.json()["sha256"]
    assert (settings.artifact_dir / "files" / "bob" / f"{sha}.jsonl").exists()
    assert not (settings.artifact_dir / "files" / "alice" / f"{sha}.jsonl").exists()
    (listing,) = send(settings, ("alice", "GET", "/v1/files", {}))
    assert [f["bytes"] for f in listing.json()["items"]] == [102]


def test_two_tenants_with_the_same_idempotency_key_get_a_job_each(
    settings: Settings,
) -> None:
    """The key is the client's: the same one from two tenants makes two jobs, and a retry
    returns the tenant's own job."""
    settings = settings.model_copy(update={"api_publish_tasks": False})
    same = {"json": smoke_spec(), "headers": {"Idempotency-Key": "retry-1"}}
    alices, bobs, again = send(
        settings,
        ("alice", "POST", "/v1/jobs", {**same}),
        ("bob", "POST", "/v1/jobs", {**same}),
        ("alice", "POST", "/v1/jobs", {**same}),
    )
    assert (alices.status_code, bobs.status_code) == (201, 201), alices.text
    assert alices.json()["id"] != bobs.json()["id"]
    assert again.status_code == 201  # as the first answer, marked as a replay
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == alices.json()["id"]
    alice_id, bob_id = alices.json()["id"], bobs.json()["id"]
    mine, theirs = send(
        settings,
        ("bob", "GET", f"/v1/jobs/{bob_id}", {}),
        ("bob", "GET", f"/v1/jobs/{alice_id}", {}),
    )
    assert (mine.status_code, theirs.status_code) == (200, 404)


def test_samples_are_the_newest_rows_up_to_the_limit(settings: Settings) -> None:
    client = _client(settings)
    seed_job(client, "j-samples", "running", tenant="alice")
    rows = [
        {
            "step": step,
            "samples": [
                {
                    "prompt": f"{step}+1=",
                    "answer": str(step + 1),
                    "completion": "7",
                    "reward": 0.0,
                    "truncated": False,
                }
            ],
        }
        for step in (1, 2, 3)
    ]
    client.rpush(samples_key("j-samples"), *(json.dumps(r) for r in rows))
    newest, default, bobs = send(
        settings,
        ("alice", "GET", "/v1/jobs/j-samples/samples?limit=2", {}),
        ("alice", "GET", "/v1/jobs/j-samples/samples", {}),
        ("bob", "GET", "/v1/jobs/j-samples/samples", {}),
    )
    assert (newest.status_code, newest.json()) == (200, {"job_id": "j-samples", "items": rows[1:]})
    assert default.json() == {"job_id": "j-samples", "items": rows}
    assert bobs.status_code == 404


def test_at_a_tenants_limits_an_upload_is_refused_before_its_body_is_read(
    settings: Settings,
) -> None:
    """At PDPPO_MAX_FILES_PER_TENANT even the re-upload of a kept file is 429 (its id is not
    known before its bytes are read); at PDPPO_MAX_FILE_BYTES_PER_TENANT any body counts for at
    least one byte, so the refusal (413) comes before the body is read or checked, even for an
    empty file (which a read would refuse as 422)."""
    at_files = settings.model_copy(update={"max_files_per_tenant": 1})
    first, again = send(
        at_files,
        ("alice", "POST", "/v1/files", upload(LINE)),
        ("alice", "POST", "/v1/files", upload(LINE)),
    )
    assert first.status_code == 201
    assert (again.status_code, native(again)) == (
        429,
        {
            "detail": "tenant 'alice' has 1 files; the limit is 1 (PDPPO_MAX_FILES_PER_TENANT): "
            "delete some first"
        },
    )
    at_bytes = settings.model_copy(update={"max_file_bytes_per_tenant": 34})
    (empty,) = send(at_bytes, ("alice", "POST", "/v1/files", upload(b"")))
    assert (empty.status_code, native(empty)) == (
        413,
        {
            "detail": "tenant 'alice' keeps 34 bytes of files; this upload would pass the limit "
            "of 34 (PDPPO_MAX_FILE_BYTES_PER_TENANT): delete some first"
        },
    )


def test_a_usage_cache_of_a_second_or_less_is_kept_for_that_long(
    settings: Settings,
) -> None:
    """PDPPO_USAGE_CACHE_SECONDS is a float: a measure is kept for any positive value (1 s:
    1000 ms), not only for whole seconds past one. Read right after the answer; on a machine too
    slow to do that within the second, the key may be gone for its own reason (skipped)."""
    settings = settings.model_copy(update={"usage_cache_seconds": 1.0})
    client = _client(settings)
    app_started = time.monotonic()
    (usage,) = send(settings, ("alice", "GET", "/v1/usage", {}))
    left_ms = client.pttl(tenant_usage_key("alice"))
    if left_ms == -2 and time.monotonic() - app_started > 0.9:
        pytest.skip("the machine took the whole second: the key expired, as it should")
    assert usage.status_code == 200
    assert 0 < left_ms <= 1000
    assert json.loads(client.get(tenant_usage_key("alice")) or "{}")["files"] == 0
