"""Event streams under load: a replay storm leaves the API responsive, streams are bounded per
tenant and in total (429 with Retry-After), and idle streams do not churn Redis connections.

The storm: hundreds of clients replay a finished job's backlog from the start at once while a
probe times `/healthz` on fresh connections, as a load balancer would. The backlog is written
straight into the job's stream (events shaped like a worker's), which takes a second instead of
the minutes a job would need to publish as many.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from typing import Any

import httpx
import pytest
import redis

from pdppo.store.keys import events_key
from tests.support.probe import start_control, start_probe, stop_probe
from tests.support.specs import smoke_spec
from tests.support.stack import KEYS, RedisServer, Service
from tests.support.waits import metric_steps, read_events

SUBSCRIBERS = 250
BACKLOG = 2000
# generous for a shared 2-core machine, past what the machine itself adds (the control probe);
# bench/api_load.py has the figure
HEALTHZ_BOUND_MS = 500
# no probe at all past this: a stall of the event loop long enough to fail a load balancer's check
STALL_BOUND_MS = 2000


def gpu_spec(**train: Any) -> dict[str, Any]:
    spec = smoke_spec(**train)
    spec["resources"] = {"device": "gpu"}  # no GPU worker here: it stays queued
    return spec


def ended_job_with_backlog(client: httpx.Client, redis_url: str, events: int) -> str:
    job_id = str(client.post("/v1/jobs", json=gpu_spec(steps=events)).json()["id"])
    metrics = {"reward_mean": 0.25, "reward_std": 0.1, "loss": -0.01, "kl": 0.002}
    store = redis.Redis.from_url(redis_url)
    try:
        pipe = store.pipeline(transaction=False)
        for step in range(1, events + 1):
            data = {"step": step, "total": events, "metrics": {**metrics, "step": float(step)}}
            pipe.xadd(events_key(job_id), {"type": "metrics", "data": json.dumps(data)})
        pipe.execute()
    finally:
        store.close()
    assert client.post(f"/v1/jobs/{job_id}/cancel").json()["status"] == "cancelled"
    return job_id


async def replay(
    host: str, port: int, path: str, key: str, began: float
) -> tuple[int, int, float | None]:
    """(status, frames, seconds to `done`) of one client reading the stream to its end. Counts
    frames in the raw bytes: parsing 250 x 2000 frames in Python would load the machine more
    than the server does."""
    pattern, tail, frames, done = b"\r\nevent: ", b"", 0, None
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
        "Connection: close\r\n\r\n".encode()
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    # the body, chunk by chunk (the chunked encoding's size lines would break the patterns)
    while size := int((await reader.readline()).strip() or b"0", 16):
        buffer = tail + (await reader.readexactly(size + 2))[:-2]
        frames += buffer.count(pattern)
        if done is None and b"event: done" in buffer:
            done = time.perf_counter() - began
        tail = buffer[-(len(pattern) - 1) :]
    writer.close()
    return int(head.split()[1]), frames, done


async def storm(base_url: str, path: str, key: str) -> list[tuple[int, int, float | None]]:
    host, port = base_url.removeprefix("http://").split(":")
    began = time.perf_counter()
    async with asyncio.timeout(180):
        return await asyncio.gather(
            *(replay(host, int(port), path, key, began) for _ in range(SUBSCRIBERS))
        )


def test_replay_storm_keeps_health_checks_fast_and_redis_connections_few(
    alice: httpx.Client, service: Service
) -> None:
    job_id = ended_job_with_backlog(alice, service.redis_url, BACKLOG)
    store = redis.Redis.from_url(service.redis_url)
    clients_before = int(store.info("clients")["connected_clients"])
    control, control_url = start_control()
    probe = start_probe(service.base_url, "/healthz", 0.02, timeout=30)
    control_probe = start_probe(control_url, "/", 0.02, timeout=30)
    time.sleep(0.5)  # their interpreters started and probing
    try:
        results = asyncio.run(storm(service.base_url, f"/v1/jobs/{job_id}/events", KEYS["alice"]))
    finally:
        rows = stop_probe(probe)
        control_rows = stop_probe(control_probe)
        control.kill()
        control.wait()
        assert all(status == 200 for _, status in rows), rows
        probes = [ms for ms, _ in rows]
        machine = [ms for ms, _ in control_rows]
    clients_after = int(store.info("clients")["connected_clients"])
    store.close()

    expected = BACKLOG + 3  # status queued, the metrics, status cancelled, done
    assert [r[0] for r in results] == [200] * SUBSCRIBERS
    assert [r[1] for r in results] == [expected] * SUBSCRIBERS  # every event, each once
    assert all(r[2] is not None for r in results)
    # The bound is the API's, on top of what the machine added to a probe of a server that does
    # nothing, probed at the same moments (other tests beside this one in a parallel run: the
    # slowest probe once took 709 ms). A storm that stalls the API's event loop stalls its
    # probes for as long, and not the control's. One probe in 20 may pass the bound, none the
    # stall bound: on CI's shared 2 cores one probe in 52 took 716 ms while the control's slowest
    # took 29 ms (the API's process descheduled once, as a kubelet would also see now and then);
    # a loop stalled by the replay is slow on most of its probes, or on one for seconds.
    assert len(machine) >= 10, machine
    bound = HEALTHZ_BOUND_MS + max(machine)
    over = [ms for ms in probes if ms >= bound]
    assert len(probes) >= 10, probes
    assert len(over) <= len(probes) // 20, (sorted(probes)[-5:], sorted(machine)[-5:])
    assert max(probes) < STALL_BOUND_MS + max(machine), (sorted(probes)[-5:], sorted(machine)[-5:])
    # No connection per subscriber: the requests' pool is capped (PDPPO_API_REDIS_MAX_CONNECTIONS,
    # 64), the backlog was read a page at a time for all, and an ended job needs no live reader.
    assert clients_after - clients_before <= 64, (clients_before, clients_after)
    events = read_events(alice, job_id)  # and what they got is the job's history, parsed
    assert len(events) == expected and metric_steps(events) == list(range(1, BACKLOG + 1))


def test_stream_limits_answer_429_with_retry_after(make_service: Any) -> None:
    svc: Service = make_service(PDPPO_SSE_MAX_STREAMS_PER_TENANT="2", PDPPO_SSE_MAX_STREAMS="3")
    svc.start_api()
    with svc.client("alice") as alice, svc.client("bob") as bob, contextlib.ExitStack() as open_:
        alice_job = alice.post("/v1/jobs", json=gpu_spec()).json()["id"]
        bob_job = bob.post("/v1/jobs", json=gpu_spec()).json()["id"]

        def stream(client: httpx.Client, job: str) -> httpx.Response:
            return open_.enter_context(client.stream("GET", f"/v1/jobs/{job}/events"))

        first = stream(alice, alice_job)
        assert first.status_code == 200 and stream(alice, alice_job).status_code == 200
        refused = stream(alice, alice_job)
        assert refused.status_code == 429
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert "tenant 'alice' has 2 open event streams" in refused.read().decode()

        assert stream(bob, bob_job).status_code == 200  # another tenant: its own limit
        full = stream(bob, bob_job)  # but the server holds 3 at most
        assert full.status_code == 429 and "Retry-After" in full.headers
        assert "this server has 3 open event streams" in full.read().decode()

        # A stream that ends gives its place back, at once: in about 1 run in 12 it used to keep
        # it until its job ended, a cancel lost in the stream's store call (see
        # `api.streaming.cancel`).
        first.close()
        closed = time.monotonic()
        while (again := stream(alice, alice_job)).status_code == 429:
            waited = time.monotonic() - closed
            assert waited < 10, (
                f"the closed stream's place was not given back in {waited:.0f} s:"
                + svc.tail("api.log", 3000)
            )
            again.close()
            time.sleep(0.2)
        assert again.status_code == 200


def test_idle_stream_outlives_the_block_time_without_redis_errors(
    alice: httpx.Client, service: Service
) -> None:
    """The feed's XREAD BLOCK (5 s) runs on connections whose socket timeout is longer: an idle
    stream neither times out nor logs, and still delivers when the job moves."""
    job_id = alice.post("/v1/jobs", json=gpu_spec()).json()["id"]
    log_before = len(service.tail("api.log", 10_000_000))
    lines: list[str] = []
    with alice.stream("GET", f"/v1/jobs/{job_id}/events") as response:
        started = time.monotonic()
        cancelled = False
        for line in response.iter_lines():
            lines.append(line)
            if not cancelled and time.monotonic() - started > 12:  # past two blocks
                assert alice.post(f"/v1/jobs/{job_id}/cancel").is_success
                cancelled = True
    assert cancelled and "event: done" in lines
    log = service.tail("api.log", 10_000_000)[log_before:]
    assert "sse feed" not in log and "Traceback" not in log, log[-3000:]


def test_live_streams_read_over_their_own_connections(make_service: Any) -> None:
    """Six live streams of six jobs with the requests' pool at 4 connections: each job's feed
    blocks in XREAD on the streams' own pool, so all six read at once and requests still get a
    connection at once (on the requests' pool, two feeds would wait and requests behind them)."""
    svc: Service = make_service(
        PDPPO_API_REDIS_MAX_CONNECTIONS="4", PDPPO_MAX_ACTIVE_JOBS_PER_TENANT="6"
    )
    svc.start_api()
    store = redis.Redis.from_url(svc.redis_url)
    db = svc.redis_url.rsplit("/", 1)[1]

    def feeds_reading() -> int:
        return sum(c["cmd"] == "xread" and c["db"] == db for c in store.client_list())

    with svc.client("alice") as alice, contextlib.ExitStack() as open_:
        jobs = [alice.post("/v1/jobs", json=gpu_spec()).json()["id"] for _ in range(6)]
        for job in jobs:
            response = open_.enter_context(alice.stream("GET", f"/v1/jobs/{job}/events"))
            assert response.status_code == 200
        deadline = time.monotonic() + 10
        while feeds_reading() < 6:
            assert time.monotonic() < deadline, f"{feeds_reading()} of 6 feeds reading"
            time.sleep(0.1)
        started = time.monotonic()
        assert [alice.get(f"/v1/jobs/{job}").json()["status"] for job in jobs] == ["queued"] * 6
        assert time.monotonic() - started < 3  # a request waiting on a blocked feed: 5 s
    store.close()


def test_a_live_feed_notices_a_stalled_redis_and_goes_on(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Redis stops answering (stopped here with SIGSTOP; a partition looks the same) while a
    feed waits in XREAD BLOCK: the feed's socket times out one reply timeout after the block
    time (5 s + 1 s here), it says so once in the log and reads on, and the stream still ends
    with the job. A socket without that timeout would wait on a dead connection for ever."""
    server = RedisServer(tmp_path_factory.mktemp("stalled"))
    svc = Service(
        server, tmp_path_factory.mktemp("stalled-api"), db=0,
        env={"PDPPO_REDIS_SOCKET_TIMEOUT_SECONDS": "1", "PDPPO_SSE_PING_SECONDS": "0.5"},
    )  # fmt: skip
    try:
        svc.start_api()
        with svc.client("alice") as alice:
            job = alice.post("/v1/jobs", json=gpu_spec()).json()["id"]
            with alice.stream("GET", f"/v1/jobs/{job}/events") as response:
                lines = response.iter_lines()
                # Up to a ping: the stream is past its backlog and its look at the job (a stall
                # before then ends the stream: a Redis error of the request's own), live.
                for line in lines:
                    if line == ": ping":
                        break
                else:
                    raise AssertionError("the stream ended before its first ping")
                os.kill(server.proc.pid, signal.SIGSTOP)
                time.sleep(7)  # an XREAD sent up to 5 s before the stop times out 1-6 s into it
                os.kill(server.proc.pid, signal.SIGCONT)
                assert f"sse feed {job}: Redis error" in svc.tail("api.log", 100_000)
                assert alice.post(f"/v1/jobs/{job}/cancel").json()["status"] == "cancelled"
                rest = list(lines)
        assert "event: done" in rest
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        svc.stop()
        server.stop()
