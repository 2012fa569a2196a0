"""Unit tests of the client's retried writes (`pdppo.client.retry`), against a scripted transport.

The stall itself, with a real Redis and API, is in `tests/integration/test_redis_stall_writes.py`;
these pin what a live stack cannot produce on demand: a cancel whose first try landed behind a
503 (the retry then meets a 409), a connection dropped after the request was sent, a server that
stays away.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from pdppo.client import ApiError, Client
from tests.client.scripted import scripted

JOB = {"id": "j1", "status": "queued"}
NAMING_503 = httpx.Response(
    503,
    json={"detail": "the job store did not answer in time", "job_id": "j1"},
    headers={"Pdppo-Job-Id": "j1", "Retry-After": "5"},
)


def _client(transport: httpx.MockTransport, retry_seconds: float = 30) -> Client:
    return Client(
        "http://pdppo.test",
        "key",
        transport=transport,
        retry_seconds=retry_seconds,
        max_retry_delay=0,
    )


def test_submit_retries_with_one_idempotency_key_it_made() -> None:
    def dropped(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    transport, seen = scripted(
        [lambda r: NAMING_503, dropped, lambda r: httpx.Response(201, json=JOB)]
    )
    with _client(transport) as client:
        assert client.submit({"train": {}}).id == "j1"
    keys = [r.headers["Idempotency-Key"] for r in seen]
    assert len(keys) == 3 and len(set(keys)) == 1
    assert keys[0].startswith("pdppo-")


def test_a_given_key_is_used_as_it_is() -> None:
    transport, seen = scripted([lambda r: httpx.Response(201, json=JOB)])
    with _client(transport) as client:
        client.submit({"train": {}}, idempotency_key="mine")
    assert seen[0].headers["Idempotency-Key"] == "mine"


def test_a_cancel_that_landed_behind_a_503_is_not_a_409() -> None:
    cancelled = {**JOB, "status": "cancelled", "cancel_requested": True}
    transport, seen = scripted(
        [
            lambda r: NAMING_503,
            lambda r: httpx.Response(409, json={"detail": "job 'j1' already cancelled"}),
            lambda r: httpx.Response(200, json=cancelled),
        ]
    )
    with _client(transport) as client:
        job = client.cancel("j1")
    assert (job.status, job.cancel_requested) == ("cancelled", True)
    assert [(r.method, r.url.path) for r in seen] == [
        ("POST", "/v1/jobs/j1/cancel"),
        ("POST", "/v1/jobs/j1/cancel"),
        ("GET", "/v1/jobs/j1"),
    ]


def test_a_409_with_nothing_ambiguous_before_it_stays_a_409() -> None:
    transport, seen = scripted(
        [lambda r: httpx.Response(409, json={"detail": "job 'j1' already succeeded"})]
    )
    with _client(transport) as client, pytest.raises(ApiError) as info:
        client.cancel("j1")
    assert info.value.status_code == 409
    assert len(seen) == 1


def test_a_409_after_a_503_that_did_not_land_stays_a_409() -> None:
    done = {**JOB, "status": "succeeded"}
    transport, _ = scripted(
        [
            lambda r: NAMING_503,
            lambda r: httpx.Response(409, json={"detail": "job 'j1' already succeeded"}),
            lambda r: httpx.Response(200, json=done),
        ]
    )
    with _client(transport) as client, pytest.raises(ApiError) as info:
        client.cancel("j1")
    assert info.value.status_code == 409


def test_giving_up_names_every_job_that_may_exist_and_the_key() -> None:
    def naming(job_id: str) -> Callable[[httpx.Request], httpx.Response]:
        return lambda r: httpx.Response(
            503, json={"detail": "stalled", "job_id": job_id}, headers={"Pdppo-Job-Id": job_id}
        )

    transport, seen = scripted([naming("a"), naming("b"), naming("b")])
    with _client(transport, retry_seconds=0) as client, pytest.raises(ApiError) as info:
        client.submit({"train": {}}, idempotency_key="k")
    assert info.value.status_code == 503
    assert info.value.may_exist == ["a"]  # no time for a second try
    assert str(info.value).endswith(
        "stalled (may exist: a; the same spec with Idempotency-Key k returns it, never a second)"
    )
    assert len(seen) == 1


def test_a_plain_503_is_retried_and_names_nothing() -> None:
    transport, seen = scripted(
        [
            lambda r: httpx.Response(503, json={"detail": "busy"}),
            lambda r: httpx.Response(202, json=JOB),
        ]
    )
    with _client(transport) as client:
        assert client.pause("j1").id == "j1"
    assert len(seen) == 2


def test_a_server_that_cannot_be_reached_is_said_at_once() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    transport, seen = scripted([refuse])
    with _client(transport) as client, pytest.raises(httpx.ConnectError):
        client.submit({"train": {}})
    assert len(seen) == 1


def test_a_refused_connect_after_an_ambiguous_try_is_retried() -> None:
    """The API restarting after a 503 that named the job: keep going, the key still holds."""

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    transport, seen = scripted(
        [lambda r: NAMING_503, refuse, lambda r: httpx.Response(201, json=JOB)]
    )
    with _client(transport) as client:
        assert client.submit({"train": {}}).id == "j1"
    assert len(seen) == 3


def test_the_first_retry_is_said(caplog: pytest.LogCaptureFixture) -> None:
    transport, _ = scripted(
        [
            lambda r: NAMING_503,
            lambda r: NAMING_503,
            lambda r: NAMING_503,
            lambda r: httpx.Response(201, json=JOB),
        ]
    )
    with _client(transport) as client, caplog.at_level("WARNING", "pdppo.client"):
        client.submit({"train": {}})
    assert [r.getMessage() for r in caplog.records] == [
        "POST /v1/jobs: HTTP 503: the job store did not answer in time; retrying for up to 30s"
    ]
