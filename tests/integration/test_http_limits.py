"""HTTP limits of `pdppo serve` (issue 37, point 5): slow clients are answered and cut off, a huge
header gets 431, connections past the limit get 503 at once, and meanwhile everyone else is
served: requests, an event stream that lives longer than any timeout, an upload at a fair speed.

Every test talks to a real `pdppo serve` over real sockets: the limits live in the HTTP protocol
(`api.http.http_limits`), below anything an in-process client would reach.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.support.specs import records, smoke_spec
from tests.support.stack import KEYS, RedisServer, Service, stall

HEAD_TIMEOUT = 2.0
BODY_TIMEOUT = 2.0
SLACK = 1.5  # timer wake-up and a loaded 2-core machine
LIMITS = {
    "PDPPO_HTTP_HEADER_TIMEOUT_SECONDS": str(HEAD_TIMEOUT),
    "PDPPO_HTTP_BODY_TIMEOUT_SECONDS": str(BODY_TIMEOUT),
    "PDPPO_HTTP_BODY_MIN_RATE": "1024",
}


@pytest.fixture
def api(make_service: Callable[..., Service]) -> Iterator[Service]:
    svc = make_service(**LIMITS)
    svc.start_api()
    yield svc


def port_of(svc: Service) -> int:
    return int(svc.base_url.rsplit(":", 1)[1])


@dataclass
class Slow:
    """A connection that sends `first`, then one byte a second: when it closed, what it got."""

    sock: socket.socket
    opened: float
    closed_after: float | None = None
    received: bytes = b""
    sent: int = 0
    log: list[str] = field(default_factory=list)


def open_slow(port: int, count: int, first: bytes) -> list[Slow]:
    out = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.setblocking(False)
        if first:
            sock.send(first)
        out.append(Slow(sock, time.monotonic()))
    return out


def trickle(conns: list[Slow], byte: bytes, until: float) -> None:
    """One byte a second to every open connection (none when `byte` is empty), reading whatever
    comes back, until each is closed by the server or `until` (monotonic) passes."""
    next_send = time.monotonic()
    while time.monotonic() < until:
        open_ = [c for c in conns if c.closed_after is None]
        if not open_:
            return
        if byte and time.monotonic() >= next_send:
            for c in open_:
                try:
                    c.sent += c.sock.send(byte)
                except (BlockingIOError, BrokenPipeError, ConnectionResetError) as exc:
                    c.log.append(type(exc).__name__)
            next_send += 1.0
        poller = select.poll()  # not select(): no limit on descriptor numbers
        for c in open_:
            poller.register(c.sock, select.POLLIN)
        readable = {fd for fd, _ in poller.poll(100)}
        for c in open_:
            if c.sock.fileno() not in readable:
                continue
            try:
                data = c.sock.recv(65536)
            except ConnectionResetError:
                data = b""
                c.log.append("reset")
            c.received += data
            if not data:
                c.closed_after = time.monotonic() - c.opened
    for c in conns:
        c.sock.close()


def served_meanwhile(svc: Service, seconds: float) -> list[float]:
    """Latencies of a normal client's requests (a listing, with its key) for `seconds`."""
    latencies = []
    with svc.client("alice") as alice:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.monotonic()
            assert alice.get("/v1/jobs").status_code == 200
            latencies.append(time.monotonic() - started)
            time.sleep(0.2)
    return latencies


def run_slow(svc: Service, conns: list[Slow], byte: bytes, limit: float) -> list[float]:
    thread = threading.Thread(target=trickle, args=(conns, byte, time.monotonic() + limit + 20))
    thread.start()
    latencies = served_meanwhile(svc, limit)
    thread.join()
    return latencies


def check_cut_off(conns: list[Slow], limit: float) -> None:
    closed = [c.closed_after for c in conns if c.closed_after is not None]
    assert len(closed) == len(conns), f"{len(conns) - len(closed)} of {len(conns)} still open"
    assert max(closed) < limit + SLACK, sorted(closed)[-5:]
    for c in conns:
        assert c.received.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), (c.received, c.log)
        assert b'{"detail": "request' in c.received


def test_slow_headers_are_answered_408_and_closed(api: Service) -> None:
    conns = open_slow(port_of(api), 60, b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n")
    conns += open_slow(port_of(api), 20, b"")  # connect and send nothing at all
    latencies = run_slow(api, conns, b"X", HEAD_TIMEOUT + SLACK)
    check_cut_off(conns, HEAD_TIMEOUT)
    assert max(latencies) < 1.0, latencies


def test_a_body_at_one_byte_a_second_is_answered_408_and_closed(api: Service) -> None:
    head = (
        "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {KEYS['alice']}\r\nContent-Length: 100000\r\n\r\n{{"
    ).encode()
    conns = open_slow(port_of(api), 60, head)
    latencies = run_slow(api, conns, b" ", BODY_TIMEOUT + SLACK)
    check_cut_off(conns, BODY_TIMEOUT + 0.1)  # + a few bytes' worth of allowance
    assert max(latencies) < 1.0, latencies
    assert "Traceback" not in api.tail("api.log", 100_000)
    with api.client("alice") as alice:  # none of them made a job
        assert alice.get("/v1/jobs").json()["items"] == []


def test_a_keep_alive_connection_gets_a_fresh_head_deadline(api: Service) -> None:
    """Idle between requests is the keep-alive timeout's business; the head deadline runs from
    the first byte of each request, not from the connection's opening."""
    sock = socket.create_connection(("127.0.0.1", port_of(api)), timeout=10)
    with sock:
        for _ in range(3):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while not answer.endswith(b"}"):  # the head and the JSON body may come apart
                chunk = sock.recv(65536)
                assert chunk, answer
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200 OK"), answer
            time.sleep(HEAD_TIMEOUT * 0.75)  # shorter than uvicorn's keep-alive (5 s)


def test_a_huge_header_gets_431_not_a_reset(api: Service) -> None:
    with api.client("alice") as alice:
        answer = alice.get("/v1/jobs", headers={"X-Big": "a" * 1_000_000})
        assert answer.status_code == 431
        assert "PDPPO_HTTP_MAX_HEADER_BYTES" in answer.json()["detail"]
        assert alice.get("/v1/jobs").status_code == 200
        # Under the limit, a big header is just a header.
        assert alice.get("/v1/jobs", headers={"X-Big": "a" * 30_000}).status_code == 200


def test_an_event_stream_outlives_every_timeout(api: Service) -> None:
    with api.client("alice") as alice:
        job_id = alice.post("/v1/jobs", json=smoke_spec()).json()["id"]  # queued: no worker
        pings = 0
        started = time.monotonic()
        with alice.stream("GET", f"/v1/jobs/{job_id}/events") as stream:
            for line in stream.iter_lines():
                pings += line.startswith(":")
                if time.monotonic() - started > HEAD_TIMEOUT + BODY_TIMEOUT + 2:
                    break
        assert pings >= 3, pings


def test_an_upload_at_a_fair_speed_longer_than_the_body_timeout_is_taken(api: Service) -> None:
    data = records(60_000)  # ~1.3 MB, sent at ~400 KB/s: ~3 s, past the 2 s body timeout
    boundary = "pdppoboundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="d.jsonl"\r\n'
        "Content-Type: application/x-ndjson\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    body = head + data + tail

    def paced() -> Iterator[bytes]:
        for at in range(0, len(body), 40_000):
            yield body[at : at + 40_000]
            time.sleep(0.1)

    with api.client("alice") as alice:
        started = time.monotonic()
        answer = alice.post(
            "/v1/files",
            content=paced(),
            headers={
                "Content-Type": f"multipart/form-data; boundary={boundary}",
                "Content-Length": str(len(body)),
            },
        )
        took = time.monotonic() - started
    assert answer.status_code == 201, answer.text
    assert answer.json()["records"] == 60_000
    assert took > BODY_TIMEOUT, took


def test_connections_past_the_limit_get_503_at_once(make_service: Callable[..., Service]) -> None:
    svc = make_service(**LIMITS, PDPPO_HTTP_MAX_CONNECTIONS="8")
    svc.start_api()
    held = [socket.create_connection(("127.0.0.1", port_of(svc))) for _ in range(8)]
    try:
        time.sleep(0.3)
        started = time.monotonic()
        refused = httpx.get(f"{svc.base_url}/healthz", timeout=5)
        assert time.monotonic() - started < 1.0
        assert refused.status_code == 503
        assert refused.headers["Retry-After"] == "1"
        assert "PDPPO_HTTP_MAX_CONNECTIONS" in refused.json()["detail"]
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.3)
    assert httpx.get(f"{svc.base_url}/healthz", timeout=5).status_code == 200


def test_readyz_answers_503_within_2s_during_a_redis_stall(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    svc = Service(own_redis, tmp_path / "service")  # the default 10 s store timeout
    svc.start_api()
    try:
        sleeper = stall(own_redis, 5)
        time.sleep(0.2)
        started = time.monotonic()
        answer = httpx.get(f"{svc.base_url}/readyz", timeout=10)
        took = time.monotonic() - started
        assert answer.status_code == 503, answer.text
        assert answer.json() == {"status": "unavailable", "detail": "redis: TimeoutError"}
        assert took < 2.5, took
        sleeper.join(30)
        assert httpx.get(f"{svc.base_url}/readyz", timeout=10).status_code == 200
    finally:
        svc.stop()
