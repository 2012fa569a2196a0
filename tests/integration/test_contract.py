"""The published contract is the real one: `/openapi.json` against what the running API answers.

On the real API process: every status an operation can answer is documented with its error model,
every 422 has the one documented shape (`ValidationErrorBody`: `detail` a string, `errors` a
list), a 405 names every method of the path in `Allow`, Prometheus method labels are a fixed set,
`/metrics` can be put behind a token, and a failed job shows the tenant a code and a message, never
the worker's traceback. `tests/contract/run_schemathesis.py` fuzzes the same contract in CI.
"""

from __future__ import annotations

import json
import random
import re
import string
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis

from api.openai.errors import is_openai
from api.schemas import ErrorBody, ServerSentEvent, ValidationErrorBody
from pdppo.store import job_key
from tests.support.specs import smoke_spec
from tests.support.stack import Service
from tests.support.waits import read_events, wait_status

REF = "#/components/schemas/"
ERROR_REF = REF + "ErrorBody"
VALIDATION_REF = REF + "ValidationErrorBody"
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
PROMETHEUS_METHODS = {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"}


@pytest.fixture(scope="module")
def openapi(service: Service) -> dict[str, Any]:
    schema: dict[str, Any] = httpx.get(f"{service.base_url}/openapi.json", timeout=30).json()
    return schema


def _operations(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if method in HTTP_METHODS:
                yield method.upper(), path, operation


def _json_ref(operation: dict[str, Any], status: str) -> str | None:
    """The body's model; on `/v1/files`, where an error holds both shapes (`allOf` of the
    native model and `OpenAIErrorBody`), the native one."""
    response = operation["responses"].get(status)
    if response is None:
        return None
    ref: str | None = response.get("content", {}).get("application/json", {}).get("schema", {})
    if not isinstance(ref, dict):
        return None
    if "allOf" in ref:
        native, openai = (part.get("$ref") for part in ref["allOf"])
        return native if openai == REF + "OpenAIErrorBody" else None
    return ref.get("$ref")


def _parked_spec(name: str = "contract") -> dict[str, Any]:
    """No GPU worker runs in the tests, so a gpu job stays queued and costs nothing."""
    spec = smoke_spec()
    spec["name"] = name
    spec["resources"] = {"device": "gpu"}
    return spec


# --- the schema documents every status, with one model per kind of error ---------------------


# Writes whose 503 names the job, file or experiment they may still create or change
# (api.jobs.pending_writes).
NAMING_503 = {
    ("POST", "/v1/jobs"): ("Pdppo-Job-Id",),
    ("POST", "/v1/jobs/{job_id}/cancel"): ("Pdppo-Job-Id",),
    ("POST", "/v1/jobs/{job_id}/pause"): ("Pdppo-Job-Id",),
    ("POST", "/v1/jobs/{job_id}/resume"): ("Pdppo-Job-Id",),
    ("PATCH", "/v1/jobs/{job_id}"): ("Pdppo-Job-Id",),
    ("POST", "/v1/files"): ("Pdppo-File-Id",),
    # its own record first, then the child it was creating
    ("POST", "/v1/experiments"): ("Pdppo-Experiment-Id", "Pdppo-Job-Id"),
}


def test_every_operation_documents_its_errors_with_their_models(openapi: dict[str, Any]) -> None:
    """401 on every /v1 call, 404 on a job's, 400 and 413 on a body, 503 where Redis is read
    (all of /v1 but the validation, which reads nothing), 500 everywhere; every 4xx/5xx body is
    `ErrorBody`, except 422, always `ValidationErrorBody`."""
    seen = 0
    for method, path, operation in _operations(openapi):
        seen += 1
        where = f"{method} {path}"
        statuses = set(operation["responses"])
        params = operation.get("parameters", [])
        openai = is_openai(path)  # OpenAI's routes and errors: 400 for a 422
        invalid = "400" if openai else "422"
        expected = {"500"}
        if path.startswith("/v1/"):
            expected.add("401")  # and 422 where it takes parameters or a body (below)
        reads_nothing = path == "/v1/jobs:validate" or path.startswith("/v1/fine_tuning/alpha/")
        if path.startswith("/v1/") and not reads_nothing:
            expected.add("503")
        if "{job_id}" in path or "{fine_tuning_job_id}" in path:
            expected.add("404")
        if "requestBody" in operation:
            expected |= {"400", "413", invalid}
        if params:
            expected.add(invalid)
        missing = expected - statuses
        assert not missing, f"{where} documents {sorted(statuses)}; missing {sorted(missing)}"
        assert not (openai and "422" in statuses), f"{where}: OpenAI's routes answer 400"
        for status in statuses:
            if int(status) < 400:
                continue
            ref = _json_ref(operation, status)
            if path.startswith("/v1/files"):  # both shapes: pdppo's and OpenAI's
                schema = operation["responses"][status]["content"]["application/json"]["schema"]
                assert "allOf" in schema, f"{where} {status} is {schema}, not both shapes"
            want = VALIDATION_REF if status == "422" else ERROR_REF
            if openai:
                want = REF + "OpenAIErrorBody"
            if path == "/readyz" and status == "503":
                want = REF + "Health"
            if (method, path) == ("PATCH", "/v1/jobs/{job_id}") and status == "412":
                want = REF + "VersionMismatchBody"  # an ErrorBody with the job's config_version
            if (method, path) in NAMING_503 and status == "503":
                want = REF + "StoreUnavailableBody"
                headers = operation["responses"]["503"]["headers"]
                assert set(NAMING_503[(method, path)]) <= set(headers), (where, headers)
            assert ref == want, f"{where} {status} is {ref}, not {want}"
    assert seen >= 11
    extra = {
        ("POST", "/v1/jobs"): {"409", "429"},
        ("POST", "/v1/jobs/{job_id}/cancel"): {"409"},
        ("DELETE", "/v1/jobs/{job_id}"): {"204", "409"},
        ("DELETE", "/v1/files/{file_id}"): {"200", "409"},
        ("GET", "/v1/usage"): {"200"},
    }
    for (method, path), statuses in extra.items():
        documented = set(openapi["paths"][path][method.lower()]["responses"])
        assert statuses <= documented, (method, path, documented)


def test_fastapis_default_validation_model_is_not_published(openapi: dict[str, Any]) -> None:
    schemas = openapi["components"]["schemas"]
    assert "HTTPValidationError" not in schemas
    assert "HTTPValidationError" not in json.dumps(openapi["paths"])
    body = schemas["ValidationErrorBody"]
    assert body["required"] == ["detail", "errors"]
    assert body["properties"]["detail"]["type"] == "string"
    assert body["properties"]["errors"]["type"] == "array"
    assert schemas["ErrorBody"]["required"] == ["detail"]


def test_optional_parameters_are_absent_never_null(openapi: dict[str, Any]) -> None:
    """A header or query parameter is a string or not there; `null` would invite the text
    "null" (which Schemathesis sends as `Last-Event-ID: null`)."""
    for method, path, operation in _operations(openapi):
        for parameter in operation.get("parameters", []):
            text = json.dumps(parameter["schema"])
            assert '"null"' not in text, (method, path, parameter)


def test_a_failed_jobs_error_is_documented_without_a_traceback(openapi: dict[str, Any]) -> None:
    job_error = openapi["components"]["schemas"]["JobError"]
    assert set(job_error["properties"]) == {"code", "message"}


# --- the real answers have the documented shapes ---------------------------------------------


def _assert_validation_body(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    body: dict[str, Any] = response.json()
    assert set(body) == {"detail", "errors"}, body
    ValidationErrorBody.model_validate(body, strict=True)
    assert isinstance(body["detail"], str) and body["detail"]
    return body


SPEC_YAML = b"name: yaml\ntrain:\n  steps: 3\n"


def _json_bodies(schema: dict[str, Any], job_id: str) -> list[tuple[str, str, str, str]]:
    """(method, path template, path with the job's id, media type) of every operation taking
    a JSON body."""
    out = []
    for method, path, operation in _operations(schema):
        for media in operation.get("requestBody", {}).get("content", {}):
            if media == "application/json" or media.endswith("+json"):
                assert set(re.findall(r"\{(\w+)\}", path)) <= {"job_id"}, path
                out.append((method, path, path.replace("{job_id}", job_id), media))
    return out


def _detail(response: httpx.Response, path: str) -> str:
    body = response.json()
    if is_openai(path):
        assert set(body) == {"error"}, body
        return str(body["error"]["message"])
    ErrorBody.model_validate(body, strict=True)
    return str(body["detail"])


def test_a_body_that_is_not_json_is_a_400_on_every_route_that_takes_json(
    alice: httpx.Client, openapi: dict[str, Any]
) -> None:
    """YAML sent as JSON, or JSON sent as another media type: the body cannot be read, a 400
    that says so (issue 49: `422 "0: JSON decode error"`), documented with its model."""
    job = alice.post("/v1/jobs", json=_parked_spec()).json()  # a job's routes find it
    try:
        routes = _json_bodies(openapi, job["id"])
        assert len(routes) >= 10, routes
        for method, template, path, media in routes:
            documented = openapi["paths"][template][method.lower()]["responses"]["400"]
            assert "not JSON" in documented["description"], (path, documented)
            yaml = alice.request(method, path, content=SPEC_YAML, headers={"Content-Type": media})
            assert yaml.status_code == 400, (method, path, yaml.text)
            said = _detail(yaml, path)
            assert said == "the body is not JSON: Expecting value (line 1, column 1)", said
            text = alice.request(
                method, path, content=b'{"train": {}}', headers={"Content-Type": "text/yaml"}
            )
            assert text.status_code == 400, (method, path, text.text)
            assert _detail(text, path) == (
                "the body is not JSON (Content-Type: text/yaml); send JSON as application/json"
            )
    finally:
        alice.post(f"/v1/jobs/{job['id']}/cancel")
    broken = alice.post(
        "/v1/jobs",
        content=b'{"train":\n  {"steps": 3,}}',
        headers={"Content-Type": "application/json"},
    )
    assert _detail(broken, "/v1/jobs") == (
        "the body is not JSON: Expecting property name enclosed in double quotes "
        "(line 2, column 15)"
    )


def test_every_422_has_the_documented_shape(alice: httpx.Client) -> None:
    spec = smoke_spec()
    spec["train"]["steps"] = "many"
    _assert_validation_body(alice.post("/v1/jobs", json=spec))
    # a body that is not JSON is a 400, not a 422 (test_a_body_that_is_not_json_is_a_400)
    _assert_validation_body(alice.get("/v1/jobs", params={"limit": 0}))
    _assert_validation_body(alice.get("/v1/jobs/" + "x" * 65))
    # refused after the schema: a path outside the data roots, a job over its budget
    outside = _parked_spec()
    outside["train"]["task"] = {"name": "jsonl", "path": "/etc/passwd"}
    refused = _assert_validation_body(alice.post("/v1/jobs", json=outside))
    assert refused["detail"].startswith("train.task.path: ")
    assert refused["errors"] == []
    huge = _parked_spec()
    huge["train"]["rollout"] = {"prompts_per_step": 4096, "group_size": 4096}
    assert _assert_validation_body(alice.post("/v1/jobs", json=huge))["errors"] == []
    job = alice.post("/v1/jobs", json=_parked_spec()).json()
    try:
        stream = alice.get(f"/v1/jobs/{job['id']}/events", headers={"Last-Event-ID": "yesterday"})
        # a 422 if the schema gives the id's pattern (FastAPI checks it), else the route's 400
        # (tests/integration/test_event_ids): either way the body of the documented model
        if stream.status_code == 422:
            assert "Last-Event-ID" in _assert_validation_body(stream)["detail"]
        else:
            assert stream.status_code == 400, stream.text
            assert set(stream.json()) == {"detail"}, stream.text
            assert "Last-Event-ID" in ErrorBody.model_validate(stream.json(), strict=True).detail
    finally:
        alice.post(f"/v1/jobs/{job['id']}/cancel")


def test_other_errors_are_a_detail_string(alice: httpx.Client, service: Service) -> None:
    with service.client(None) as anonymous:
        unauthorized = anonymous.get("/v1/jobs")
    missing = alice.get("/v1/jobs/0123/checkpoints")
    job = alice.post("/v1/jobs", json=_parked_spec()).json()
    alice.post(f"/v1/jobs/{job['id']}/cancel")
    conflict = alice.post(f"/v1/jobs/{job['id']}/cancel")
    not_allowed = alice.request("DELETE", "/v1/jobs")
    for response, status in ((unauthorized, 401), (missing, 404), (conflict, 409)):
        assert response.status_code == status, response.text
        assert set(response.json()) == {"detail"}, response.text
        ErrorBody.model_validate(response.json(), strict=True)
    assert not_allowed.json() == {"detail": "Method Not Allowed"}


def _raw_events(body: str) -> list[dict[str, str]]:
    """The stream as an SSE parser reads it (WHATWG rules: blank line ends an event, `:` lines are
    comments), without the client library's conveniences, so every field the server sent counts."""
    events: list[dict[str, str]] = []
    fields: dict[str, str] = {}
    for line in re.split(r"\r\n|\r|\n", body):
        if not line:
            if "data" in fields:
                events.append({"event": "message", **fields})
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
    return events


def test_each_event_of_a_stream_fits_the_documented_event_schema(
    alice: httpx.Client, openapi: dict[str, Any]
) -> None:
    operation = openapi["paths"]["/v1/jobs/{job_id}/events"]["get"]
    documented = operation["responses"]["200"]["content"]["text/event-stream"]["schema"]
    assert documented == ServerSentEvent.model_json_schema()
    job = alice.post("/v1/jobs", json=_parked_spec()).json()
    alice.post(f"/v1/jobs/{job['id']}/cancel")
    stream = alice.get(f"/v1/jobs/{job['id']}/events", timeout=30)
    assert stream.status_code == 200, stream.text
    events = _raw_events(stream.text)
    assert [e["event"] for e in events] == ["status", "status", "done"], events
    for event in events:
        ServerSentEvent.model_validate(event, strict=True)
        json.loads(event["data"])
    # a pattern the server breaks is caught: the documented id is what Last-Event-ID takes back
    assert all(re.fullmatch(documented["properties"]["id"]["pattern"], e["id"]) for e in events)


# --- 405 and Allow --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("OPTIONS", "/v1/jobs", "GET, POST"),
        ("DELETE", "/v1/jobs", "GET, POST"),
        ("PUT", "/v1/jobs", "GET, POST"),
        ("HEAD", "/v1/jobs", "GET, POST"),
        ("OPTIONS", "/v1/jobs:validate", "POST"),
        ("GET", "/v1/jobs:validate", "POST"),
        ("PUT", "/v1/jobs/0123", "DELETE, GET, PATCH"),
        ("OPTIONS", "/v1/jobs/0123", "DELETE, GET, PATCH"),
        ("GET", "/v1/jobs/0123/pause", "POST"),
        ("PUT", "/v1/jobs/0123/resume", "POST"),
        ("GET", "/v1/jobs/0123/cancel", "POST"),
        ("POST", "/v1/jobs/0123/events", "GET"),
        ("PATCH", "/v1/jobs/0123/checkpoints/step-000001", "GET"),
        ("OPTIONS", "/healthz", "GET"),
        ("POST", "/metrics", "GET"),
    ],
)
def test_405_allow_names_every_method_of_the_path(
    service: Service, method: str, path: str, allow: str
) -> None:
    """Starlette answers with the first route on the path; `Allow` must list all of them."""
    with service.client("alice") as client:
        response = client.request(method, path)
    assert response.status_code == 405, response.text
    assert response.headers["allow"] == allow


def test_allow_matches_the_schema_for_every_path(service: Service, openapi: dict[str, Any]) -> None:
    with service.client("alice") as client:
        for path, item in openapi["paths"].items():
            concrete = re.sub(r"\{[^}]+\}", "0123", path)
            response = client.options(concrete)
            documented = sorted(m.upper() for m in item if m in HTTP_METHODS)
            assert response.status_code == 405, (path, response.text)
            assert response.headers["allow"] == ", ".join(documented), path


# --- Prometheus ------------------------------------------------------------------------------


def _series(text: str, name: str) -> list[dict[str, str]]:
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels = line[len(name) + 1 : line.rindex("}")]
            out.append(dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels)))
    return out


def test_metrics_method_labels_are_a_fixed_set(service: Service) -> None:
    """2,000 requests with made-up methods add a handful of series, not 2,000."""
    rng = random.Random(9)
    with service.client(None) as anonymous:
        anonymous.get("/healthz")
        before = anonymous.get("/metrics").text
        for _ in range(2000):
            method = "".join(rng.choices(string.ascii_uppercase, k=rng.randint(4, 12)))
            anonymous.request(method, rng.choice(["/v1/jobs", "/healthz", "/nowhere"]))
        anonymous.request("get", "/healthz")  # methods are case-sensitive: not GET
        after = anonymous.get("/metrics").text
    requests = _series(after, "pdppo_http_requests_total")
    latency = _series(after, "pdppo_http_request_duration_seconds_bucket")
    assert requests and latency
    assert {frozenset(s) for s in requests} == {frozenset({"method", "route", "status"})}
    assert {frozenset(s) for s in latency} == {frozenset({"method", "route", "le"})}
    methods = {s["method"] for s in requests} | {s["method"] for s in latency}
    assert methods <= PROMETHEUS_METHODS, methods - PROMETHEUS_METHODS
    others = {(s["route"], s["status"]) for s in requests if s["method"] == "other"}
    assert others >= {("/v1/jobs", "405"), ("/healthz", "405"), ("unmatched", "404")}
    growth = len(after.splitlines()) - len(before.splitlines())
    assert growth < 100, f"{growth} new lines in /metrics"
    assert len(after) < len(before) + 20_000


def test_metrics_can_need_a_token(make_service: Callable[..., Service]) -> None:
    svc = make_service(PDPPO_METRICS_TOKEN="metrics-token-0123456789")
    svc.start_api()
    with svc.client(None) as anonymous:
        missing = anonymous.get("/metrics")
        wrong = anonymous.get("/metrics", headers={"Authorization": "Bearer nope"})
        basic = anonymous.get("/metrics", headers={"Authorization": "Basic bWV0cmljcw=="})
        right = anonymous.get(
            "/metrics", headers={"Authorization": "Bearer metrics-token-0123456789"}
        )
        health = anonymous.get("/healthz")
    with svc.client("alice") as alice:
        tenant = alice.get("/metrics")  # a tenant's API key is not the metrics token
    for response in (missing, wrong, basic, tenant):
        assert response.status_code == 401, response.text
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json() == {"detail": "missing or invalid metrics token"}
    assert right.status_code == 200
    assert "pdppo_http_requests_total" in right.text
    assert health.status_code == 200


# --- a failed job: code and message for the tenant, the traceback for the operator ----------


def test_a_failed_jobs_traceback_is_not_served_to_the_tenant(
    alice: httpx.Client, service: Service
) -> None:
    missing = f"{service.data_dir}/nonexistent/data.jsonl"
    spec = smoke_spec()
    spec["name"] = "fails"
    spec["train"]["task"] = {"name": "jsonl", "path": missing}
    job = alice.post("/v1/jobs", json=spec).json()
    failed = wait_status(alice, job["id"], "failed", timeout=120)
    assert failed["error"] == {
        "code": "invalid_input",
        "message": (
            f"UnsafeFileError: task.path={missing!r} cannot be read (No such file or directory)"
        ),
    }
    seen = [
        alice.get(f"/v1/jobs/{job['id']}").text,
        alice.get("/v1/jobs", params={"status": "failed", "limit": 100}).text,
        alice.post(f"/v1/jobs/{job['id']}/cancel").text,
        json.dumps(read_events(alice, job["id"], timeout=30)),
    ]
    for text in seen:
        assert "Traceback" not in text and "traceback" not in text, text[:2000]
        assert ".py" not in text, text[:2000]
    # the operator still has it: in the job's Redis record and in the worker's log
    client = redis.Redis.from_url(service.redis_url, decode_responses=True)
    try:
        trace = client.hget(job_key(job["id"]), "error_traceback")
    finally:
        client.close()
    assert isinstance(trace, str) and "Traceback" in trace and "UnsafeFileError" in trace
    deadline = time.monotonic() + 10
    while "UnsafeFileError" not in service.worker_log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "Traceback" in service.worker_log()
