"""Load on the real service over loopback: submit latency and SSE delivery latency.

Starts its own redis-server, `pdppo serve` and one `pdppo worker` (the stack of the integration
tests), then
  0. the same two measurements with a single client / subscriber, as the baseline;
  1. submit: `--clients` concurrent clients each POST `--submits` jobs (gpu jobs: no GPU worker
     runs here, so they stay queued and only the gateway, Redis and the broker are measured);
     prints p50/p99 of the request latency and the throughput;
  2. sse: `--subscribers` concurrent subscribers follow one running CPU job; each metrics event's
     delivery latency is (time received) - (time the worker added it: its stream id is the Redis
     clock in ms); only events added after every subscriber was connected count.
Client, API, worker and Redis share this machine's cores, so the figures are pessimistic; the
last lines give the loaded figures as ratios of the single-client baseline measured in the run.

    python bench/api_load.py [--clients 50 --submits 20 --subscribers 500 --sse-seconds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.integration.stack import KEYS, RedisServer, Service, smoke_spec

AUTH = {"Authorization": f"Bearer {KEYS['alice']}"}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class RawClient:
    """A minimal keep-alive HTTP/1.1 client on asyncio streams: costs the bench far less CPU
    than httpx, so that on a small machine the figures describe the server, not the client."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def send(self, method: str, path: str, body: bytes = b"") -> None:
        assert self.writer is not None
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n"
            f"Authorization: {AUTH['Authorization']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        await self.writer.drain()

    async def head(self) -> tuple[int, dict[str, str]]:
        assert self.reader is not None
        status = int((await self.reader.readline()).split()[1])
        headers = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        return status, headers

    async def chunk(self) -> bytes:
        assert self.reader is not None
        size = int((await self.reader.readline()).strip(), 16)
        data = await self.reader.readexactly(size + 2)
        return data[:-2]

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        assert self.reader is not None
        await self.send(method, path, body)
        status, headers = await self.head()
        if "content-length" in headers:
            return status, await self.reader.readexactly(int(headers["content-length"]))
        parts = []
        while part := await self.chunk():
            parts.append(part)
        return status, b"".join(parts)

    async def events(self, path: str) -> AsyncIterator[tuple[str, str]]:
        """(id, event) of each SSE frame; comments (pings) skipped."""
        await self.send("GET", path)
        status, _ = await self.head()
        assert status == 200, status
        buffer = b""
        while chunk := await self.chunk():
            buffer += chunk
            *frames, buffer = buffer.split(b"\r\n\r\n")
            for frame in frames:
                fields = dict(
                    line.split(": ", 1) for line in frame.decode().split("\r\n") if ": " in line
                )
                if "id" in fields:
                    yield fields["id"], fields.get("event", "message")

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def bench_submit(base_url: str, clients: int, submits: int) -> tuple[float, float]:
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

    ready = asyncio.Event()
    tasks = [asyncio.create_task(one_client()) for _ in range(clients)]
    while not all(t.done() for t in tasks) and len(warmed) < clients:
        await asyncio.sleep(0.01)
    began = time.perf_counter()
    ready.set()
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - began
    ms = [x * 1000 for x in latencies]
    print(
        f"submit: {len(ms)} POST /v1/jobs (after 1 warm-up each) from {clients} concurrent "
        f"clients in {wall:.1f}s "
        f"({len(ms) / wall:.0f}/s): p50 {pct(ms, 0.5):.1f} ms, p99 {pct(ms, 0.99):.1f} ms, "
        f"max {max(ms):.1f} ms, non-201: {errors or 'none'}"
    )
    return pct(ms, 0.5), pct(ms, 0.99)


async def bench_sse(base_url: str, subscribers: int, seconds: float) -> tuple[float, float]:
    host, port = base_url.removeprefix("http://").split(":")
    async with httpx.AsyncClient(base_url=base_url, headers=AUTH, timeout=60) as c:
        spec = smoke_spec(steps=100_000, checkpoint_every=0)
        # ~150 ms steps on one core: a few metrics events per second, like a small real job.
        spec["train"]["rollout"].update(prompts_per_step=32, group_size=8)
        spec["train"]["model"]["tiny"].update(d_model=64, n_layers=2, n_heads=2)
        job = (await c.post("/v1/jobs", json=spec)).json()
        while (await c.get(f"/v1/jobs/{job['id']}")).json()["progress"]["step"] < 1:
            await asyncio.sleep(0.1)

        connected = 0
        all_connected = asyncio.Event()
        window: list[int] = []  # [start ms, end ms] of the events that count
        samples: list[float] = []
        received = [0] * subscribers

        async def subscriber(index: int) -> None:
            nonlocal connected
            client = RawClient(host, int(port))
            await client.open()
            first = True
            async for entry_id, event in client.events(f"/v1/jobs/{job['id']}/events"):
                now_ms = time.time() * 1000
                if first:
                    first = False
                    connected += 1
                    if connected == subscribers:
                        start = int(now_ms)
                        window.extend([start, start + int(seconds * 1000)])
                        all_connected.set()
                if event != "metrics" or not window:
                    continue
                created_ms = int(entry_id.split("-")[0])
                if created_ms > window[1]:
                    break
                if created_ms > window[0]:
                    samples.append(now_ms - created_ms)
                    received[index] += 1
            await client.close()

        began = time.perf_counter()
        tasks = [asyncio.create_task(subscriber(i)) for i in range(subscribers)]
        await asyncio.wait_for(all_connected.wait(), timeout=120)
        connect_time = time.perf_counter() - began
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=seconds + 120)
        await c.post(f"/v1/jobs/{job['id']}/cancel")

    print(
        f"sse: {subscribers} subscribers connected in {connect_time:.1f}s; {max(received)} "
        f"metrics events each in {seconds:.0f}s, {len(samples)} deliveries: p50 "
        f"{pct(samples, 0.5):.1f} ms, p99 {pct(samples, 0.99):.1f} ms, max {max(samples):.1f} ms; "
        f"every subscriber got every event: {min(received) == max(received)}"
    )
    return pct(samples, 0.5), pct(samples, 0.99)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--submits", type=int, default=20, help="POSTs per client")
    parser.add_argument("--subscribers", type=int, default=500)
    parser.add_argument("--sse-seconds", type=float, default=15)
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="pdppo-bench-"))
    redis = RedisServer(root)
    env: dict[str, Any] = {
        "PDPPO_MAX_ACTIVE_JOBS_PER_TENANT": "1000000",
        "PDPPO_LOG_LEVEL": "WARNING",
    }
    service = Service(redis, root / "service", env=env)
    try:
        base_url = service.start_api()
        service.start_worker("cpu")
        assert service.api is not None
        pids = {"api": service.api.pid, "worker": service.workers[0].pid}
        figures: dict[str, tuple[float, float]] = {}
        for name, bench in (
            ("submit x1", lambda: bench_submit(base_url, 1, 200)),
            ("submit", lambda: bench_submit(base_url, args.clients, args.submits)),
            ("sse x1", lambda: bench_sse(base_url, 1, 5)),
            ("sse", lambda: bench_sse(base_url, args.subscribers, args.sse_seconds)),
        ):
            before = {k: cpu_seconds(pid) for k, pid in pids.items()}
            client_before, wall_before = own_cpu_seconds(), time.perf_counter()
            figures[name] = asyncio.run(bench())
            wall = time.perf_counter() - wall_before
            used = {k: cpu_seconds(pid) - before[k] for k, pid in pids.items()}
            used["bench client"] = own_cpu_seconds() - client_before
            print(
                f"  {name} CPU seconds over {wall:.1f}s wall: "
                + ", ".join(f"{k} {v:.1f}" for k, v in used.items())
                + f"; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
            )
        loads = {"submit": f"{args.clients} clients", "sse": f"{args.subscribers} subscribers"}
        for name, load in loads.items():
            (p50_1, p99_1), (p50_n, p99_n) = figures[f"{name} x1"], figures[name]
            print(
                f"{name}: {load} vs 1, same run: p50 x{p50_n / p50_1:.1f} "
                f"({p50_1:.1f} -> {p50_n:.1f} ms), p99 x{p99_n / p99_1:.1f} "
                f"({p99_1:.1f} -> {p99_n:.1f} ms)"
            )
    finally:
        service.stop()
        redis.stop()


if __name__ == "__main__":
    main()
