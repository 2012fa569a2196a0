"""Unit tests of `Client.follow`'s reconnect logic, one function against a scripted transport.

The end-to-end behaviour (a real API, a real drop) is in `test_client_stack.py`; these pin the
edge cases that a live stack cannot produce on demand: a drop in the middle of a chunk, a 5xx
while reconnecting, a 4xx that must not be retried, a server that never comes back.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pdppo.client import ApiError, Client, FollowError, spec_to_dict
from tests.client.scripted import scripted

SSE = {"content-type": "text/event-stream"}


class _DroppingStream(httpx.SyncByteStream):
    """Sends `chunks`, then fails like a connection reset (or ends cleanly)."""

    def __init__(self, chunks: list[bytes], fail: bool) -> None:
        self.chunks = chunks
        self.fail = fail

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks
        if self.fail:
            raise httpx.ReadError("connection reset by peer")


def _event(event_id: int, name: str, data: str) -> bytes:
    return f"id: {event_id}-0\nevent: {name}\ndata: {data}\n\n".encode()


def _client(transport: httpx.MockTransport, max_reconnects: int = 20) -> Client:
    return Client(
        "http://pdppo.test",
        "key",
        transport=transport,
        reconnect_delay=0,
        max_reconnects=max_reconnects,
    )


def test_follow_resumes_after_a_drop_mid_event_with_last_event_id() -> None:
    first = _event(1, "status", '{"status": "running"}') + _event(2, "metrics", '{"step": 1}')
    half = _event(3, "metrics", '{"step": 2}')[:12]  # the drop cuts event 3 in half
    transport, seen = scripted(
        [
            lambda r: httpx.Response(200, headers=SSE, stream=_DroppingStream([first, half], True)),
            lambda r: httpx.Response(
                200,
                headers=SSE,
                stream=_DroppingStream(
                    [
                        b": ping - 2026-11-30 14:00:00\r\n\r\n",
                        _event(3, "metrics", '{"step": 2}'),
                        b": ping - 2026-11-30 14:00:01\r\n\r\n",
                        _event(4, "done", '{"status": "succeeded"}'),
                        _event(5, "log", '{"message": "after done: never read"}'),
                    ],
                    False,
                ),
            ),
        ]
    )
    with _client(transport) as client:
        events = list(client.follow("job1"))
    assert [e.id for e in events] == ["1-0", "2-0", "3-0", "4-0"]
    assert [e.event for e in events] == ["status", "metrics", "metrics", "done"]
    assert events[2].json() == {"step": 2}
    assert len(seen) == 2
    assert "last-event-id" not in seen[0].headers
    assert seen[1].headers["last-event-id"] == "2-0"
    assert seen[1].headers["authorization"] == "Bearer key"
    assert seen[1].url.path == "/v1/jobs/job1/events"


def test_follow_starts_after_the_given_event_id() -> None:
    transport, seen = scripted(
        [
            lambda r: httpx.Response(
                200, headers=SSE, stream=_DroppingStream([_event(9, "done", "{}")], False)
            )
        ]
    )
    with _client(transport) as client:
        assert [e.event for e in client.follow("j", last_event_id="8-0")] == ["done"]
    assert seen[0].headers["last-event-id"] == "8-0"


def test_follow_retries_5xx_and_a_clean_end_before_done() -> None:
    transport, seen = scripted(
        [
            lambda r: httpx.Response(
                200, headers=SSE, stream=_DroppingStream([_event(1, "status", "{}")], False)
            ),
            lambda r: httpx.Response(503, json={"detail": "redis unavailable"}),
            lambda r: httpx.Response(
                200, headers=SSE, stream=_DroppingStream([_event(2, "done", "{}")], False)
            ),
        ]
    )
    with _client(transport) as client:
        assert [e.id for e in client.follow("j")] == ["1-0", "2-0"]
    assert [r.headers.get("last-event-id") for r in seen] == [None, "1-0", "1-0"]


def test_follow_does_not_retry_a_client_error() -> None:
    transport, seen = scripted([lambda r: httpx.Response(404, json={"detail": "job j not found"})])
    with _client(transport) as client, pytest.raises(ApiError) as info:
        list(client.follow("j"))
    assert info.value.status_code == 404
    assert info.value.detail == "job j not found"
    assert len(seen) == 1


def _refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def _flowing(request: httpx.Request) -> httpx.Response:
    """A stream that sends one event, then drops: the server was there."""
    return httpx.Response(
        200, headers=SSE, stream=_DroppingStream([_event(1, "status", "{}")], True)
    )


def test_follow_raises_a_refused_first_connection_at_once() -> None:
    """Nothing ever answered (a wrong URL, a server that is down): httpx's own error, which the
    CLI reports as "cannot reach", after one try rather than a minute and a half of them."""
    transport, seen = scripted([_refuse])
    with _client(transport) as client, pytest.raises(httpx.ConnectError):
        list(client.follow("j", last_event_id="4-0"))
    assert len(seen) == 1


def test_follow_waits_out_a_refusal_once_the_stream_has_flowed() -> None:
    """A server that answered and then refuses is restarting: reconnect, resume after the last
    event seen."""
    done = httpx.Response(
        200, headers=SSE, stream=_DroppingStream([_event(2, "done", "{}")], False)
    )
    transport, seen = scripted([_flowing, _refuse, _refuse, lambda r: done])
    with _client(transport) as client:
        assert [e.id for e in client.follow("j")] == ["1-0", "2-0"]
    assert [r.headers.get("last-event-id") for r in seen] == [None, "1-0", "1-0", "1-0"]


def test_follow_waits_out_a_refusal_when_the_server_answered_this_client_before() -> None:
    """`pdppo submit --follow` across an API restart: the submit was answered, then the
    follow's first connection is refused. The server is known to exist: a restart, waited for
    (it ended the command with "cannot reach" before)."""
    done = httpx.Response(
        200, headers=SSE, stream=_DroppingStream([_event(2, "done", "{}")], False)
    )
    transport, seen = scripted([lambda r: httpx.Response(200), _refuse, lambda r: done])
    with _client(transport) as client:
        assert client.health()
        assert [e.id for e in client.follow("j")] == ["2-0"]
    assert [r.url.path for r in seen] == ["/readyz", "/v1/jobs/j/events", "/v1/jobs/j/events"]


def _bad_gateway(request: httpx.Request) -> httpx.Response:
    """What a reverse proxy answers while the API behind it is down."""
    return httpx.Response(502, text="<html><body><h1>502 Bad Gateway</h1></body></html>")


def test_follow_raises_a_first_5xx_at_once_when_the_api_never_answered() -> None:
    """A gateway answering 502 in front of an API that is down is a server that cannot be
    reached, said at once as `ApiError` (the CLI: "HTTP 502 from GET <url>"), as `pdppo status`
    says it: it was taken for a restart and retried 20 times (88 s), then "lost the job's event
    stream"."""
    transport, seen = scripted([_bad_gateway])
    with _client(transport) as client, pytest.raises(ApiError) as info:
        list(client.follow("j"))
    assert (info.value.status_code, info.value.method) == (502, "GET")
    assert info.value.url == "http://pdppo.test/v1/jobs/j/events"
    assert len(seen) == 1


def test_follow_gives_up_on_a_gateway_naming_the_url_and_its_answer() -> None:
    """The API answered before (a submit), then the gateway answers 502 from then on: a restart
    waited for, `max_reconnects` times, and the error says where and what was answered."""
    transport, seen = scripted([lambda r: httpx.Response(200), _bad_gateway])
    with _client(transport, max_reconnects=3) as client:
        assert client.health()
        with pytest.raises(FollowError) as info:
            list(client.follow("j", last_event_id="7-0"))
    assert str(info.value).startswith("gave up following job j after 3 reconnects in 0s: ")
    assert str(info.value).endswith(
        ": GET http://pdppo.test/v1/jobs/j/events: answered HTTP 502 Bad Gateway "
        "(last event id '7-0')"
    )
    assert len(seen) == 5  # the health check, the first try and three reconnects


def test_follow_gives_up_when_the_server_stays_away() -> None:
    transport, seen = scripted([_flowing, _refuse])
    with _client(transport, max_reconnects=3) as client, pytest.raises(FollowError):
        list(client.follow("j"))
    assert len(seen) == 4  # the connection that dropped and three reconnects


def test_reconnects_back_off_exponentially_up_to_a_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []
    monkeypatch.setattr("pdppo.client.time.sleep", slept.append)
    transport, _ = scripted([_flowing, _refuse])
    client = Client(
        "http://pdppo.test",
        "key",
        transport=transport,
        reconnect_delay=0.5,
        max_reconnect_delay=3.0,
        max_reconnects=6,
    )
    with client, pytest.raises(FollowError, match="after 6 reconnects"):
        list(client.follow("j"))
    assert slept == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]


def test_spec_to_dict_reads_yaml(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: t\ntrain:\n  steps: 3\n")
    assert spec_to_dict(path) == {"name": "t", "train": {"steps": 3}}
    path.write_text("- not a mapping\n")
    with pytest.raises(ValueError, match="mapping"):
        spec_to_dict(path)


def test_client_imports_no_server_code() -> None:
    code = (
        "import sys, pdppo.client, pdppo.commands.jobs;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('api', 'workers', 'core'));"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
