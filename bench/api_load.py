"""Load on the real service over loopback: submit latency, SSE delivery, and a replay storm.

Starts its own redis-server, `pdppo serve` and one `pdppo worker` (the stack of the integration
tests), then
  0. the submit and SSE measurements with a single client / subscriber, as the baseline;
  1. submit: `--clients` concurrent clients each POST `--submits` jobs (gpu jobs: no GPU worker
     runs here, so they stay queued), while the CPU worker trains a job beside them; prints
     p50/p99 of the request latency and the throughput;
  2. sse: `--subscribers` concurrent subscribers follow one running CPU job; each metrics event's
     delivery latency is (time received) - (time the worker added it: its stream id is the Redis
     clock in ms); only events added after every subscriber was connected count;
  3. storm: a finished job with a backlog of `--backlog` metrics events (real payloads, written
     straight into its stream), a freshly restarted API, and `--storm-subscribers` clients that
     all connect at once and replay it from the start (as after a restart or a network blip):
     time to first byte and to `done` per client, `/healthz` and `/metrics` latency meanwhile
     (a new connection per probe, as a load balancer or kubelet probes), the API's RSS and the
     Redis client count before, during (peak) and after the storm.
Client, API, worker and Redis share this machine's cores, so the figures are pessimistic; the
submit and sse lines end with the loaded figures as ratios of the single-client baseline.

    python bench/api_load.py [--clients 50 --submits 20 --subscribers 1000 --sse-seconds 15
                              --storm-subscribers 1000 --backlog 3000 --phases submit,sse,storm]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, cast

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.loadlib import (
    AUTH,
    RawClient,
    Refused,
    cpu_seconds,
    own_cpu_seconds,
    pct,
    probe_ms,
    rss_mb,
)
from pdppo.store.keys import events_key
from tests.support.probe import start_probe, stop_probe
from tests.support.specs import smoke_spec
from tests.support.stack import RedisServer, Service, stop_process


def live_job_spec() -> dict[str, Any]:
    """A CPU job that trains for as long as the bench runs: ~150 ms steps on one core, a few
    metrics events per second, like a small real job."""
    spec = smoke_spec(steps=100_000, checkpoint_every=0)
    spec["train"]["rollout"].update(prompts_per_step=32, group_size=8)
    spec["train"]["model"]["tiny"].update(d_model=64, n_layers=2, n_heads=2)
    return spec


async def start_live_job(c: httpx.AsyncClient) -> str:
    job = (await c.post("/v1/jobs", json=live_job_spec())).json()
    while (await c.get(f"/v1/jobs/{job['id']}")).json()["progress"]["step"] < 1:
        await asyncio.sleep(0.1)
    return str(job["id"])


async def bench_submit(base_url: str, clients: int, submits: int) -> tuple[float, float]:
    """POST latency with the worker training a job beside it (the job is cancelled after)."""
    spec = smoke_spec()
    spec["resources"] = {"device": "gpu"}
    body = json.dumps(spec).encode()
    host, port = base_url.removeprefix("http://").split(":")
    latencies: list[float] = []
    errors: dict[int, int] = {}
    warmed: list[int] = []

    async def one_client() -> None:
        client = RawClient(host, int(port))
        await client.open()
        await client.request("POST", "/v1/jobs", body)  # warm-up: connection, pools, scripts
        warmed.append(1)
        await ready.wait()
        for _ in range(submits):
            start = time.perf_counter()
            status, _ = await client.request("POST", "/v1/jobs", body)
            latencies.append(time.perf_counter() - start)
            if status != 201:
                errors[status] = errors.get(status, 0) + 1
        await client.close()

    async with httpx.AsyncClient(base_url=base_url, headers=AUTH, timeout=60) as c:
        training = await start_live_job(c)
        try:
            ready = asyncio.Event()
            tasks = [asyncio.create_task(one_client()) for _ in range(clients)]
            while not all(t.done() for t in tasks) and len(warmed) < clients:
                await asyncio.sleep(0.01)
            began = time.perf_counter()
            ready.set()
            await asyncio.gather(*tasks)
            wall = time.perf_counter() - began
        finally:
            await c.post(f"/v1/jobs/{training}/cancel")
    ms = [x * 1000 for x in latencies]
    print(
        f"submit: {len(ms)} POST /v1/jobs (after 1 warm-up each) from {clients} concurrent "
        f"clients in {wall:.1f}s, a job training beside them "
        f"({len(ms) / wall:.0f}/s): p50 {pct(ms, 0.5):.1f} ms, p99 {pct(ms, 0.99):.1f} ms, "
        f"max {max(ms):.1f} ms, non-201: {errors or 'none'}"
    )
    return pct(ms, 0.5), pct(ms, 0.99)


async def bench_sse(base_url: str, subscribers: int, seconds: float) -> tuple[float, float]:
    host, port = base_url.removeprefix("http://").split(":")
    async with httpx.AsyncClient(base_url=base_url, headers=AUTH, timeout=60) as c:
        job_id = await start_live_job(c)
        connected = 0
        refused: dict[int, int] = {}  # by status; 0: the connection was cut
        cut = [0]  # connected, then cut before the window ended
        all_connected = asyncio.Event()
        window: list[int] = []  # [start ms, end ms] of the events that count
        samples: list[float] = []
        received = [0] * subscribers

        def settled() -> None:
            if connected + sum(refused.values()) == subscribers:
                start = int(time.time() * 1000)
                window.extend([start, start + int(seconds * 1000)])
                all_connected.set()

        async def subscriber(index: int) -> None:
            nonlocal connected
            client = RawClient(host, int(port))
            await client.open()
            first = True
            try:
                async for entry_id, event in client.events(f"/v1/jobs/{job_id}/events"):
                    now_ms = time.time() * 1000
                    if first:
                        first = False
                        connected += 1
                        settled()
                    if event != "metrics" or not window:
                        continue
                    created_ms = int(entry_id.split("-")[0])
                    if created_ms > window[1]:
                        break
                    if created_ms > window[0]:
                        samples.append(now_ms - created_ms)
                        received[index] += 1
            except Refused as exc:
                refused[exc.status] = refused.get(exc.status, 0) + 1
                settled()
            except (ValueError, OSError, asyncio.IncompleteReadError):
                # the connection was cut: before the first event it counts as refused
                if first:
                    refused[0] = refused.get(0, 0) + 1
                    settled()
                else:
                    cut[0] += 1
            await client.close()

        try:
            began = time.perf_counter()
            tasks = [asyncio.create_task(subscriber(i)) for i in range(subscribers)]
            await asyncio.wait_for(all_connected.wait(), timeout=120)
            connect_time = time.perf_counter() - began
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=seconds + 120)
        finally:
            await c.post(f"/v1/jobs/{job_id}/cancel")

    got = [n for n in received if n]
    all_got = len(got) == connected and min(got, default=0) == max(got, default=0)
    print(
        f"sse: {connected}/{subscribers} live subscribers connected in {connect_time:.1f}s "
        f"(refused: {refused or 'none'}, cut after connecting: {cut[0]}); "
        f"{max(received)} metrics events each in {seconds:.0f}s, "
        f"{len(samples)} deliveries: p50 {pct(samples, 0.5):.1f} ms, p99 "
        f"{pct(samples, 0.99):.1f} ms, max {pct(samples, 1.0):.1f} ms; every connected "
        f"subscriber got every event: {all_got}"
    )
    return pct(samples, 0.5), pct(samples, 0.99)


# -- the replay storm --------------------------------------------------------------------------


def make_backlog(base_url: str, store: redis.Redis, sample: dict[str, Any], events: int) -> str:
    """A finished job whose stream holds `events` metrics events: a gpu job (it stays queued),
    its events written like a worker's (same fields, the payload of a real step), cancelled."""
    spec = smoke_spec(steps=events)
    spec["resources"] = {"device": "gpu"}
    with httpx.Client(base_url=base_url, headers=AUTH, timeout=60) as c:
        job_id = str(c.post("/v1/jobs", json=spec).json()["id"])
        key = events_key(job_id)
        for start in range(1, events + 1, 1000):
            pipe = store.pipeline(transaction=False)
            for step in range(start, min(start + 1000, events + 1)):
                data = {"step": step, "total": events, "metrics": {**sample, "step": float(step)}}
                pipe.xadd(key, {"type": "metrics", "data": json.dumps(data)})
            pipe.execute()
        c.post(f"/v1/jobs/{job_id}/cancel").raise_for_status()
    return job_id


def sample_metrics(store: redis.Redis) -> dict[str, Any]:
    """The metrics of a real step from any job this bench ran (the sse phase's), else a stand-in
    of the same keys."""
    for key in store.scan_iter(match=events_key("*"), count=1000):
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]], store.xrevrange(key, count=50))
        for _id, fields in entries:
            if fields.get(b"type") == b"metrics":
                return dict(json.loads(fields[b"data"])["metrics"])
    names = (
        "reward_mean reward_std loss kl masked_fraction ratio_mean ratio_max entropy "
        "grad_norm response_len tokens_per_s rollout_time update_time step_time"
    )
    return {name: 0.123456789 for name in names.split()}


async def replay(
    host: str, port: int, path: str, began: float, limit: float
) -> tuple[int, float | None, float | None, int]:
    """One subscriber replaying from the start: (status, first byte s, done s, events), times
    from `began`. Counts frames in the raw bytes: a bench that parsed 1000 x thousands of frames
    in Python would measure itself."""
    status, first, done, count = 0, None, None, 0
    pattern, tail = b"\r\nevent: ", b""
    try:
        async with asyncio.timeout(limit):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(
                f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: {AUTH['Authorization']}"
                "\r\nConnection: close\r\n\r\n".encode()
            )
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split()[1])
            # the body, chunk by chunk (the chunked encoding's size lines would break patterns)
            while size := int((await reader.readline()).strip() or b"0", 16):
                data = (await reader.readexactly(size + 2))[:-2]
                if first is None and status == 200:  # an error's body is no event
                    first = time.perf_counter() - began
                buffer = tail + data
                count += buffer.count(pattern)
                if done is None and b"event: done" in buffer:
                    done = time.perf_counter() - began
                tail = buffer[-(len(pattern) - 1) :]
            writer.close()
    except (TimeoutError, OSError, ValueError, IndexError, asyncio.IncompleteReadError):
        pass
    return status, first, done, count


async def bench_storm(
    service: Service, store: redis.Redis, job_id: str, subscribers: int
) -> dict[str, float]:
    base_url = service.base_url
    host, port_text = base_url.removeprefix("http://").split(":")
    port = int(port_text)
    assert service.api is not None
    pid = service.api.pid
    async with httpx.AsyncClient(base_url=base_url, headers=AUTH, timeout=30) as c:
        await c.get(f"/v1/jobs/{job_id}")  # warm: a first request of each kind
        await c.get("/healthz")
    rss_before, clients_before = rss_mb(pid), int(store.info("clients")["connected_clients"])
    peak = {"rss": rss_before, "clients": float(clients_before)}
    finished = threading.Event()

    def sample() -> None:  # a thread: the bench's event loop is too busy to sample on time
        while not finished.wait(0.1):
            peak["rss"] = max(peak["rss"], rss_mb(pid))
            clients = store.info("clients")["connected_clients"]
            peak["clients"] = max(peak["clients"], float(clients))

    sampler = threading.Thread(target=sample, name="sampler", daemon=True)
    sampler.start()
    health_probe = start_probe(base_url, "/healthz", 0.05)
    metrics_probe = start_probe(base_url, "/metrics", 1.0)
    await asyncio.sleep(0.5)  # their interpreters started
    began = time.perf_counter()
    path = f"/v1/jobs/{job_id}/events"
    results = await asyncio.gather(
        *(replay(host, port, path, began, 120) for _ in range(subscribers))
    )
    wall = time.perf_counter() - began
    health, metrics = probe_ms(stop_probe(health_probe)), probe_ms(stop_probe(metrics_probe))
    finished.set()
    sampler.join()
    await asyncio.sleep(5)  # streams closed; let the API settle
    rss_after = rss_mb(pid)
    await asyncio.sleep(10)
    rss_later = rss_mb(pid)
    clients_after = int(store.info("clients")["connected_clients"])

    statuses: dict[int, int] = {}
    for status, *_ in results:
        statuses[status] = statuses.get(status, 0) + 1
    firsts = [r[1] for r in results if r[1] is not None]
    dones = [r[2] for r in results if r[2] is not None]
    kinds = [f[b"type"] for _, f in cast(list[Any], store.xrange(events_key(job_id)))]
    expected = kinds.index(b"done") + 1  # statuses, the metrics, done (and a log, if any)
    counts = sorted({r[3] for r in results})
    complete = sum(1 for r in results if r[2] is not None and r[3] == expected)
    no_byte_30s = sum(1 for r in results if r[1] is None or r[1] > 30)  # refused ones too
    ms = health
    answered = [x for x in ms if x != float("inf")]
    metrics_ms = metrics
    print(
        f"storm: {subscribers} subscribers replaying a {expected}-event backlog from the start on "
        f"a fresh API, all done in {wall:.1f}s; statuses {statuses}; "
        f"{complete}/{subscribers} got every event and done (events each: {counts[:5]}); "
        f"{no_byte_30s} got no byte in 30 s"
    )
    if firsts:
        print(
            f"  time to first byte: p50 {pct(firsts, 0.5) * 1000:.0f} ms, p99 "
            f"{pct(firsts, 0.99) * 1000:.0f} ms, max {max(firsts) * 1000:.0f} ms"
        )
    if dones:
        print(
            f"  time to done: p50 {pct(dones, 0.5):.2f} s, p99 {pct(dones, 0.99):.2f} s, "
            f"max {max(dones):.2f} s"
        )
    print(
        f"  /healthz during the storm: {len(ms)} probes, {len(ms) - len(answered)} failed or "
        f"over 10 s; p50 {pct(ms, 0.5):.1f} ms, p99 {pct(ms, 0.99):.1f} ms, "
        f"max {max(ms):.1f} ms (worst 3: {sorted(ms)[-3:]}); /metrics: {len(metrics_ms)} "
        "probes, max "
        f"{max(metrics_ms, default=float('nan')):.0f} ms"
    )
    print(
        f"  API RSS: before {rss_before:.0f} MB, peak during {peak['rss']:.0f} MB, 5 s after "
        f"{rss_after:.0f} MB, 15 s after {rss_later:.0f} MB; Redis clients: before "
        f"{clients_before}, peak {peak['clients']:.0f}, after {clients_after}"
    )
    return {"healthz_p99": pct(ms, 0.99), "healthz_max": max(ms)}


def restart_api(service: Service) -> str:
    """A fresh API process, as after a deploy: the storm's reconnecting clients meet cold
    pools and caches."""
    assert service.api is not None
    stop_process(service.api)
    return service.start_api()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--submits", type=int, default=20, help="POSTs per client")
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--sse-seconds", type=float, default=15)
    parser.add_argument("--storm-subscribers", type=int, default=1000)
    parser.add_argument("--backlog", type=int, default=3000, help="events the storm replays")
    parser.add_argument("--phases", default="submit,sse,storm")
    args = parser.parse_args(argv)
    phases = set(args.phases.split(","))

    root = Path(tempfile.mkdtemp(prefix="pdppo-bench-"))
    redis_server = RedisServer(root)
    store = redis.Redis(port=redis_server.port)
    env: dict[str, Any] = {
        "PDPPO_MAX_ACTIVE_JOBS_PER_TENANT": "1000000",
        "PDPPO_LOG_LEVEL": "WARNING",
        "PDPPO_SSE_PING_SECONDS": "15",  # the default (the test stack pings every second)
        # the bench's subscribers are all one tenant's: no stream limit below them
        "PDPPO_SSE_MAX_STREAMS": str(4 * max(args.subscribers, args.storm_subscribers)),
        "PDPPO_SSE_MAX_STREAMS_PER_TENANT": str(2 * max(args.subscribers, args.storm_subscribers)),
    }
    service = Service(redis_server, root / "service", env=env)
    try:
        base_url = service.start_api()
        service.start_worker("cpu")
        assert service.api is not None
        pids = {"api": service.api.pid, "worker": service.workers[0].pid}
        figures: dict[str, tuple[float, float]] = {}
        benches: list[tuple[str, Callable[[], Coroutine[Any, Any, tuple[float, float]]]]] = []
        if "submit" in phases:
            benches += [
                ("submit x1", lambda: bench_submit(base_url, 1, 200)),
                ("submit", lambda: bench_submit(base_url, args.clients, args.submits)),
            ]
        if "sse" in phases:
            benches += [
                ("sse x1", lambda: bench_sse(base_url, 1, 5)),
                ("sse", lambda: bench_sse(base_url, args.subscribers, args.sse_seconds)),
            ]
        for name, bench in benches:
            before = {k: cpu_seconds(pid) for k, pid in pids.items()}
            client_before, wall_before = own_cpu_seconds(), time.perf_counter()
            figures[name] = asyncio.run(bench())
            wall = time.perf_counter() - wall_before
            used = {k: cpu_seconds(pid) - before[k] for k, pid in pids.items()}
            used["bench client"] = own_cpu_seconds() - client_before
            print(
                f"  {name} CPU seconds over {wall:.1f}s wall: "
                + ", ".join(f"{k} {v:.1f}" for k, v in used.items())
                + f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
                flush=True,
            )
        loads = {"submit": f"{args.clients} clients", "sse": f"{args.subscribers} subscribers"}
        for name, load in loads.items():
            if name not in phases:
                continue
            (p50_1, p99_1), (p50_n, p99_n) = figures[f"{name} x1"], figures[name]
            print(
                f"{name}: {load} vs 1, same run: p50 x{p50_n / p50_1:.1f} "
                f"({p50_1:.1f} -> {p50_n:.1f} ms), p99 x{p99_n / p99_1:.1f} "
                f"({p99_1:.1f} -> {p99_n:.1f} ms)",
                flush=True,
            )
        if "storm" in phases:
            job_id = make_backlog(base_url, store, sample_metrics(store), args.backlog)
            restart_api(service)
            asyncio.run(bench_storm(service, store, job_id, args.storm_subscribers))
    finally:
        store.close()
        service.stop()
        redis_server.stop()


if __name__ == "__main__":
    main()
