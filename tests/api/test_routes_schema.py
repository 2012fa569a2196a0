"""The OpenAPI schema of the routes, read from the app itself: each documented status carries
its model, the CSV routes offer both media types, and the Prometheus scrape stays out of it. A
client generated from the schema, or a reader of /docs, relies on exactly these; fast enough
for the quick tests of the mutation group "routes" (bench/mutation.toml)."""

from __future__ import annotations

from typing import Any

import pytest

from api.app import create_app
from pdppo.settings import Settings

ERROR = "#/components/schemas/ErrorBody"
INVALID = "#/components/schemas/ValidationErrorBody"


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    settings = Settings(  # type: ignore[call-arg]
        redis_url="redis://127.0.0.1:1/0", api_keys="alice:alice-key-0123456789", _env_file=None
    )
    return create_app(settings).openapi()


def _answers(schema: dict[str, Any], method: str, path: str) -> dict[str, dict[str, Any]]:
    """status -> {media type: the schema's $ref, or None for a body without a model}"""
    responses = schema["paths"][path][method]["responses"]
    return {
        status: {
            media: body.get("schema", {}).get("$ref")
            for media, body in answer.get("content", {}).items()
        }
        for status, answer in responses.items()
    }


@pytest.mark.parametrize(
    ("path", "model"),
    [
        ("/v1/jobs/{job_id}/metrics", "#/components/schemas/MetricsHistory"),
        ("/v1/jobs/{job_id}/eval", "#/components/schemas/EvalHistory"),
    ],
)
def test_the_csv_routes_document_json_and_csv(
    schema: dict[str, Any], path: str, model: str
) -> None:
    answers = _answers(schema, "get", path)
    assert answers == {
        "200": {"application/json": model, "text/csv": None},
        "401": {"application/json": ERROR},
        "404": {"application/json": ERROR},
        "422": {"application/json": INVALID},
        "500": {"application/json": ERROR},
        "503": {"application/json": ERROR},
    }


def test_the_event_stream_documents_each_status_it_answers(schema: dict[str, Any]) -> None:
    assert _answers(schema, "get", "/v1/jobs/{job_id}/events") == {
        "200": {"text/event-stream": None},
        "400": {"application/json": ERROR},
        "401": {"application/json": ERROR},
        "404": {"application/json": ERROR},
        "422": {"application/json": INVALID},
        "429": {"application/json": ERROR},
        "500": {"application/json": ERROR},
        "503": {"application/json": ERROR},
    }


def test_readiness_documents_its_503_and_prometheus_is_not_in_the_schema(
    schema: dict[str, Any],
) -> None:
    health = "#/components/schemas/Health"
    assert _answers(schema, "get", "/readyz") == {
        "200": {"application/json": health},
        "500": {"application/json": ERROR},
        "503": {"application/json": health},
    }
    assert "/metrics" not in schema["paths"]
    assert {"/healthz", "/readyz"} <= set(schema["paths"])


def test_submitting_a_job_documents_each_status_with_its_model(schema: dict[str, Any]) -> None:
    answers = _answers(schema, "post", "/v1/jobs")
    assert set(answers) == {
        "201",
        "400",
        "401",
        "404",
        "409",
        "413",
        "422",
        "429",
        "500",
        "503",
        "507",
    }
    assert answers["201"] == {"application/json": "#/components/schemas/Job"}
    assert answers["422"] == {"application/json": INVALID}
    # a 503 after the write was sent names the job it may have made (api.jobs.pending_writes)
    assert answers["503"] == {"application/json": "#/components/schemas/StoreUnavailableBody"}
    errors = set(answers) - {"201", "422", "503"}
    assert {s: answers[s] for s in errors} == {s: {"application/json": ERROR} for s in errors}


@pytest.mark.parametrize(
    ("path", "retry", "naming"),
    [
        ("/v1/jobs", "a retry with the same Idempotency-Key returns it", {"Pdppo-Job-Id"}),
        (
            "/v1/experiments",
            "a retry with the same Idempotency-Key returns the experiment and makes its missing "
            "children, never a second of any",
            # the experiment's own record, then each child
            {"Pdppo-Experiment-Id", "Pdppo-Job-Id"},
        ),
    ],
)
def test_a_create_documents_what_a_retry_after_its_503_does(
    schema: dict[str, Any], path: str, retry: str, naming: set[str]
) -> None:
    """A 503 after the create's write was sent may hide a made job: the schema says, as the
    503's detail does (tests/integration/test_redis_stall_writes.py), that a retry with the
    same Idempotency-Key never makes it twice, and which headers name what it was making."""
    answer = schema["paths"][path]["post"]["responses"]["503"]
    assert answer["content"]["application/json"]["schema"]["$ref"].endswith("/StoreUnavailableBody")
    assert retry in answer["description"], answer["description"]
    assert set(answer["headers"]) == naming | {"Retry-After"}


def test_validating_a_spec_documents_its_answer_as_a_200(schema: dict[str, Any]) -> None:
    """`POST /v1/jobs:validate` answers problems as data in a 200, and only a spec that is not
    one as a 422: a client tells them apart by the status alone."""
    answers = _answers(schema, "post", "/v1/jobs:validate")
    assert answers == {
        "200": {"application/json": "#/components/schemas/JobValidation"},
        "400": {"application/json": ERROR},
        "401": {"application/json": ERROR},
        "413": {"application/json": ERROR},
        "422": {"application/json": INVALID},
        "500": {"application/json": ERROR},
        "503": {"application/json": ERROR},
    }
    described = schema["paths"]["/v1/jobs:validate"]["post"]["responses"]["200"]["description"]
    assert described.startswith("the estimate, the queue's limits and every problem")


@pytest.mark.parametrize(
    ("path", "refusals"),
    [
        ("/v1/jobs/{job_id}/pause", {"409"}),  # ended, or a cancel pending
        ("/v1/jobs/{job_id}/resume", {"409", "429"}),  # not paused; past the active limit
    ],
)
def test_pause_and_resume_document_each_status_they_answer(
    schema: dict[str, Any], path: str, refusals: set[str]
) -> None:
    job = "#/components/schemas/Job"
    unavailable = "#/components/schemas/StoreUnavailableBody"
    expected = {
        "202": {"application/json": job},
        "401": {"application/json": ERROR},
        "404": {"application/json": ERROR},
        "422": {"application/json": INVALID},
        "500": {"application/json": ERROR},
        "503": {"application/json": unavailable},
    }
    expected |= {status: {"application/json": ERROR} for status in refusals}
    assert _answers(schema, "post", path) == expected


def test_changing_a_job_documents_its_precondition_and_etag(schema: dict[str, Any]) -> None:
    """`PATCH /v1/jobs/{id}` takes `If-Match` (the config version the change was computed from)
    and answers 412 with the version the job is at; it and `GET /v1/jobs/{id}` send that
    version as `ETag` (`api.jobs.preconditions`)."""
    operation = schema["paths"]["/v1/jobs/{job_id}"]["patch"]
    answers = _answers(schema, "patch", "/v1/jobs/{job_id}")
    assert answers["200"] == {"application/json": "#/components/schemas/Job"}
    assert answers["412"] == {"application/json": "#/components/schemas/VersionMismatchBody"}
    assert set(operation["responses"]["200"]["headers"]) == {"ETag"}
    assert set(operation["responses"]["412"]["headers"]) == {"ETag"}
    headers = {p["name"]: p for p in operation["parameters"] if p["in"] == "header"}
    assert set(headers) == {"If-Match"}
    assert headers["If-Match"]["required"] is False
    model = schema["components"]["schemas"]["VersionMismatchBody"]
    assert model["required"] == ["detail", "config_version"]
    get = schema["paths"]["/v1/jobs/{job_id}"]["get"]["responses"]["200"]
    assert set(get["headers"]) == {"ETag"}
