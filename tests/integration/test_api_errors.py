"""Auth, tenancy, validation, body size, idempotency, quota, listing and health, on the real API."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from tests.support.specs import smoke_spec
from tests.support.stack import Service
from tests.support.waits import wait_status


def gpu_spec(name: str = "parked") -> dict[str, object]:
    """No GPU worker runs in the tests, so a gpu job stays queued: a job that never moves."""
    spec = smoke_spec()
    spec["name"] = name
    spec["resources"] = {"device": "gpu"}
    return spec


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/jobs"),
        ("GET", "/v1/jobs"),
        ("GET", "/v1/jobs/0123"),
        ("POST", "/v1/jobs/0123/cancel"),
        ("GET", "/v1/jobs/0123/events"),
        ("GET", "/v1/jobs/0123/metrics"),
        ("GET", "/v1/jobs/0123/checkpoints"),
        ("GET", "/v1/jobs/0123/checkpoints/step-000001"),
        ("GET", "/v1/jobs/0123/model"),
    ],
)
def test_every_job_endpoint_needs_a_key(service: Service, method: str, path: str) -> None:
    with service.client(None) as anonymous:
        missing = anonymous.request(method, path, json=smoke_spec())
        wrong = anonymous.request(
            method, path, json=smoke_spec(), headers={"Authorization": "Bearer not-a-key"}
        )
    for response in (missing, wrong):
        assert response.status_code == 401, response.text
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["detail"] == "missing or invalid API key"


def test_health_and_prometheus_need_no_key(service: Service) -> None:
    # a request of its own on a jobs route, so the counter has a row to show whatever ran on this
    # service before (under pytest-xdist this may be the first test of its worker's service)
    with service.client("alice") as alice:
        assert alice.get("/v1/jobs").status_code == 200
    with service.client(None) as anonymous:
        assert anonymous.get("/healthz").json() == {"status": "ok", "detail": None}
        assert anonymous.get("/readyz").json()["status"] == "ok"
        metrics = anonymous.get("/metrics")
    assert metrics.status_code == 200
    assert "pdppo_http_requests_total" in metrics.text
    assert 'route="/v1/jobs/{job_id}"' in metrics.text or 'route="/v1/jobs"' in metrics.text


def test_another_tenants_job_is_not_found(alice: httpx.Client, bob: httpx.Client) -> None:
    job = alice.post("/v1/jobs", json=gpu_spec()).json()
    try:
        for path in ("", "/events", "/metrics", "/checkpoints", "/model"):
            response = bob.get(f"/v1/jobs/{job['id']}{path}")
            assert response.status_code == 404, (path, response.text)
            assert response.json()["detail"] == f"job {job['id']!r} not found"
        assert bob.post(f"/v1/jobs/{job['id']}/cancel").status_code == 404
        assert job["id"] not in [j["id"] for j in bob.get("/v1/jobs").json()["items"]]
        assert alice.get(f"/v1/jobs/{job['id']}").json()["status"] == "queued"
    finally:
        alice.post(f"/v1/jobs/{job['id']}/cancel")


@pytest.mark.parametrize(
    ("mutate", "field", "problem"),
    [
        (
            lambda s: s["train"].update(stepz=3),
            "train.stepz",
            "unknown field stepz; did you mean steps?",
        ),
        (
            lambda s: s.update(color="red"),
            "color",
            "unknown field color (this section takes: name, resources, train)",
        ),
        (lambda s: s["train"].update(steps=0), "train.steps", "greater than or equal to 1"),
        (lambda s: s["train"].update(steps="many"), "train.steps", "valid integer"),
        (lambda s: s.pop("train"), "train", "Field required"),
        (lambda s: s.update(resources={"device": "tpu"}), "resources.device", "'cpu' or 'gpu'"),
        (
            lambda s: s["train"]["model"]["tiny"].update(n_heads=3),
            "train.model.tiny",
            "n_heads=3 must divide",
        ),
    ],
)
def test_invalid_spec_is_422_naming_the_field(
    alice: httpx.Client, mutate: object, field: str, problem: str
) -> None:
    spec = smoke_spec()
    assert callable(mutate)
    mutate(spec)
    response = alice.post("/v1/jobs", json=spec)
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["detail"].startswith(f"{field}: "), body["detail"]
    assert problem in body["detail"]
    assert body["errors"][0]["loc"][0] == "body"


def _jsonl_spec(path: str) -> dict[str, object]:
    spec = gpu_spec("local data")
    train = spec["train"]
    assert isinstance(train, dict)
    train["task"] = {"name": "jsonl", "path": path}
    return spec


def test_specs_may_read_local_files_only_under_the_data_roots(
    alice: httpx.Client, service: Service
) -> None:
    """Another tenant's artifacts, or any file on the worker, are not a dataset or a model."""
    victim = service.artifact_dir / "some-job" / "final"
    inside = service.data_dir / "qa.jsonl"
    inside.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    escape = f"{service.data_dir}/../artifacts/x.jsonl"
    cases = [
        (_jsonl_spec(str(victim / "data.jsonl")), "train.task.path", "not under any"),
        (_jsonl_spec(escape), "train.task.path", "not under any"),
        (_jsonl_spec("qa.jsonl"), "train.task.path", "must be an absolute path"),
    ]
    for model in (f"hf:{victim}", "hf:../artifacts/some-job/final", "hf:~/models/x"):
        spec = gpu_spec("local model")
        spec["train"]["model"] = {"name": model}  # type: ignore[index]
        cases.append((spec, "train.model.name", ""))
    for spec, field, problem in cases:
        response = alice.post("/v1/jobs", json=spec)
        assert response.status_code == 422, response.text
        assert response.json()["detail"].startswith(f"{field}: "), response.json()
        assert problem in response.json()["detail"]
    allowed = alice.post("/v1/jobs", json=_jsonl_spec(str(inside)))
    assert allowed.status_code == 201, allowed.text
    alice.post(f"/v1/jobs/{allowed.json()['id']}/cancel")


def test_train_device_must_fit_the_queue(alice: httpx.Client) -> None:
    spec = smoke_spec()
    spec["train"]["device"] = "cuda"  # type: ignore[index]
    response = alice.post("/v1/jobs", json=spec)
    assert response.status_code == 422
    assert (
        "train.device='cuda' cannot run on a resources.device='cpu' worker"
        in (response.json()["detail"])
    )


def test_malformed_requests_get_4xx_not_500(alice: httpx.Client) -> None:
    not_json = alice.post(
        "/v1/jobs", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert not_json.status_code == 400  # unreadable, not a field's mistake (issue 49)
    assert not_json.json()["detail"] == (
        "the body is not JSON: Expecting property name enclosed in double quotes (line 1, column 2)"
    )
    not_object = alice.post("/v1/jobs", json=[1, 2])
    assert not_object.status_code == 422
    assert alice.get("/v1/jobs", params={"limit": 0}).json()["detail"].startswith("query.limit")
    bad_status = alice.get("/v1/jobs", params={"status": "sleeping"})
    assert bad_status.status_code == 422 and "query.status" in bad_status.json()["detail"]
    assert alice.get("/v1/jobs", params={"cursor": "x; drop"}).status_code == 422
    job = alice.post("/v1/jobs", json=gpu_spec()).json()
    try:
        bad_id = alice.get(f"/v1/jobs/{job['id']}/events", headers={"Last-Event-ID": "yesterday"})
        assert bad_id.status_code == 400 and "Last-Event-ID" in bad_id.json()["detail"]
        bad_format = alice.get(f"/v1/jobs/{job['id']}/metrics", params={"format": "xml"})
        assert bad_format.status_code == 422 and "query.format" in bad_format.json()["detail"]
    finally:
        alice.post(f"/v1/jobs/{job['id']}/cancel")


def test_oversized_body_is_413(alice: httpx.Client) -> None:
    spec = smoke_spec()
    spec["name"] = "x" * 2_000_000
    response = alice.post("/v1/jobs", json=spec)
    assert response.status_code == 413
    assert "larger than the limit" in response.json()["detail"]

    def chunks() -> object:
        for _ in range(40):
            yield b" " * 65536

    chunked = alice.post("/v1/jobs", content=chunks(), headers={"Content-Type": "application/json"})
    assert chunked.status_code == 413


def test_idempotency_key_returns_the_same_job(alice: httpx.Client) -> None:
    key = str(uuid.uuid4())
    spec = gpu_spec("idempotent")
    first = alice.post("/v1/jobs", json=spec, headers={"Idempotency-Key": key})
    retry = alice.post("/v1/jobs", json=spec, headers={"Idempotency-Key": key})
    try:
        assert first.status_code == retry.status_code == 201
        assert retry.json()["id"] == first.json()["id"]
        assert retry.headers["idempotent-replayed"] == "true"
        other = alice.post("/v1/jobs", json=gpu_spec("different"), headers={"Idempotency-Key": key})
        assert other.status_code == 409
        fresh = alice.post("/v1/jobs", json=spec, headers={"Idempotency-Key": key + "-2"})
        assert fresh.json()["id"] != first.json()["id"]
        alice.post(f"/v1/jobs/{fresh.json()['id']}/cancel")
    finally:
        alice.post(f"/v1/jobs/{first.json()['id']}/cancel")


def test_quota_of_queued_plus_running_jobs_is_429(service: Service) -> None:
    with service.client("carol") as carol:
        ids = []
        for i in range(4):  # PDPPO_MAX_ACTIVE_JOBS_PER_TENANT=4 in the test service
            created = carol.post("/v1/jobs", json=gpu_spec(f"q{i}"))
            assert created.status_code == 201, created.text
            ids.append(created.json()["id"])
        refused = carol.post("/v1/jobs", json=gpu_spec("one too many"))
        assert refused.status_code == 429
        assert (
            refused.json()["detail"]
            == "tenant 'carol' has 4 queued or running jobs; the limit is 4"
        )
        assert refused.headers["retry-after"]
        with service.client("bob") as bob:  # other tenants are not affected
            other = bob.post("/v1/jobs", json=gpu_spec())
            assert other.status_code == 201
            bob.post(f"/v1/jobs/{other.json()['id']}/cancel")
        carol.post(f"/v1/jobs/{ids[0]}/cancel")
        again = carol.post("/v1/jobs", json=gpu_spec("room again"))
        assert again.status_code == 201
        for job_id in [*ids[1:], again.json()["id"]]:
            carol.post(f"/v1/jobs/{job_id}/cancel")


def test_listing_is_own_jobs_newest_first_with_cursor_and_status(service: Service) -> None:
    with service.client("carol") as carol:
        made = []
        for i in range(3):
            made.append(carol.post("/v1/jobs", json=gpu_spec(f"list{i}")).json()["id"])
            time.sleep(0.002)
        carol.post(f"/v1/jobs/{made[1]}/cancel")
        page1 = carol.get("/v1/jobs", params={"limit": 2}).json()
        assert [j["id"] for j in page1["items"]] == [made[2], made[1]]
        assert page1["next_cursor"] == made[1]
        page2 = carol.get("/v1/jobs", params={"limit": 2, "cursor": page1["next_cursor"]}).json()
        assert page2["items"][0]["id"] == made[0]
        queued = carol.get("/v1/jobs", params={"status": "queued", "limit": 100}).json()
        assert [j["id"] for j in queued["items"]] == [made[2], made[0]]
        assert queued["next_cursor"] is None
        first = carol.get("/v1/jobs", params={"status": "queued", "limit": 1}).json()
        assert [j["id"] for j in first["items"]] == [made[2]]
        params = {"status": "queued", "limit": 1, "cursor": first["next_cursor"]}
        second = carol.get("/v1/jobs", params=params).json()
        assert [j["id"] for j in second["items"]] == [made[0]]
        assert second["next_cursor"] is None
        cancelled = carol.get("/v1/jobs", params={"status": "cancelled", "limit": 1}).json()
        assert cancelled["items"][0]["id"] == made[1]
        for job_id in (made[0], made[2]):
            carol.post(f"/v1/jobs/{job_id}/cancel")
            assert wait_status(carol, job_id, "cancelled", timeout=5)["started_at"] is None
