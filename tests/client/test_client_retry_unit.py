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


CHANGE = {"train": {"optim": {"lr": 0.001}}}


def _job(version: int, overrides: dict[str, object] | None = None) -> httpx.Response:
    return httpx.Response(
        200, json={**JOB, "config_version": version, "overrides": overrides or {}}
    )


def _stale(version: int) -> httpx.Response:
    return httpx.Response(412, json={"detail": "changed since", "config_version": version})


def _sent(requests: list[httpx.Request]) -> list[tuple[str, str | None]]:
    return [(r.method, r.headers.get("If-Match")) for r in requests]


def test_a_change_that_landed_behind_a_503_is_made_once() -> None:
    """The retry of a change whose first try landed behind a 503 carries the same If-Match, and
    the server refuses it (412): the job read again has the change, so that is the answer, and
    no third try makes it a second time."""
    transport, seen = scripted(
        [
            lambda r: _job(0),
            lambda r: NAMING_503,
            lambda r: _stale(1),
            lambda r: _job(1, CHANGE),
        ]
    )
    job = _client(transport).change("j1", CHANGE)
    assert job.config_version == 1
    assert _sent(seen) == [("GET", None), ("PATCH", '"0"'), ("PATCH", '"0"'), ("GET", None)]


def test_a_change_computed_before_another_clients_is_made_over_it() -> None:
    """A 412 with nothing ambiguous before it: another client changed the job after it was
    read. A merge patch composes, so the change is sent again over the version read now."""
    transport, seen = scripted(
        [lambda r: _job(0), lambda r: _stale(1), lambda r: _job(1), lambda r: _job(2, CHANGE)]
    )
    assert _client(transport).change("j1", CHANGE).config_version == 2
    assert _sent(seen) == [("GET", None), ("PATCH", '"0"'), ("GET", None), ("PATCH", '"1"')]


def test_a_412_after_a_503_whose_change_did_not_land_sends_it_again() -> None:
    """The retry's 412 came from another client's change (the job read again lacks this one):
    this one was not made, so it is, over that version."""
    other = {"train": {"optim": {"lr": 0.5}}}
    transport, seen = scripted(
        [
            lambda r: _job(0),
            lambda r: NAMING_503,
            lambda r: _stale(1),
            lambda r: _job(1, other),
            lambda r: _job(1, other),
            lambda r: _job(2, CHANGE),
        ]
    )
    assert _client(transport).change("j1", CHANGE).config_version == 2
    assert _sent(seen) == [
        ("GET", None),
        ("PATCH", '"0"'),
        ("PATCH", '"0"'),
        ("GET", None),  # did it land? no
        ("GET", None),  # the version to make it over
        ("PATCH", '"1"'),
    ]


def test_a_change_over_a_given_version_raises_its_412() -> None:
    transport, seen = scripted([lambda r: _stale(3)])
    with pytest.raises(ApiError) as info:
        _client(transport).change("j1", CHANGE, expected_version=2)
    assert info.value.status_code == 412
    assert _sent(seen) == [("PATCH", '"2"')]


@pytest.mark.parametrize(
    ("target", "patch", "merged"),
    [
        ({}, {}, True),
        ({"a": 1}, {"a": 1}, True),
        ({"a": 1}, {"a": 2}, False),
        ({}, {"a": 1}, False),
        ({"a": {"b": 1, "c": 2}}, {"a": {"b": 1}}, True),
        ({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}}, False),
        ({"a": 1}, {"a": {}}, False),  # an object replaces a value
        ({}, {"a": {}}, False),  # ... and is made where there was none
        ({"a": {}}, {"a": {}}, True),
        ({"a": 1}, {"a": None}, False),  # a null removes
        ({}, {"a": None}, True),
        ({"a": [1, 2]}, {"a": [1, 2]}, True),
        ({"a": [1, 2]}, {"a": [1]}, False),  # arrays are replaced whole
    ],
)
def test_a_merge_patch_is_in_a_target_when_applying_it_changes_nothing(
    target: dict[str, object], patch: dict[str, object], merged: bool
) -> None:
    from pdppo.client.retry import merged_in

    assert merged_in(target, patch) is merged
