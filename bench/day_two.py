"""The operator's trial of issue 37, on a real stack: what a service meets after its first week.

Starts its own redis-server, `pdppo serve` and a `pdppo worker` (the integration tests' stack) for
each phase and prints one line per finding, as counts:

  disk     the artifact folder on a 3 MiB tmpfs (needs root, for `mount`): a job whose checkpoints
           do not fit, the job after it, an upload that does not fit, the temporary files left,
           then the space grown to 64 MiB and the first job resumed, and to 160 MiB and again;
  stall    Redis asleep (`DEBUG SLEEP`) for longer than the API's store timeout while clients
           POST jobs without an Idempotency-Key: how many answers were errors, how many of those
           jobs exist afterwards, and how many of those answers named the job; `/readyz`'s time;
  final    jobs whose worker is killed (-9) the moment the final model's folder appears: is it
           advertised or served while the job is still running, and once the job is cancelled;
  conns    slow clients: `--slow-bodies` connections sending a body at 1 byte/s and
           `--slow-headers` sending headers as slowly, still open after `--conn-wait` seconds;
           a normal request's latency meanwhile; the status of a request with a 1 MB header.

    sudo python bench/day_two.py [--phases disk,stall,final,conns] [--stall-posts 5]
        [--slow-bodies 800 --slow-headers 300 --conn-wait 70] [--final-jobs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.specs import smoke_spec
from tests.support.stack import RedisServer, Service

ENDED = {"succeeded", "failed", "cancelled"}


def say(phase: str, text: str) -> None:
    print(f"{phase:6} {text}", flush=True)


@contextmanager
def stack(root: Path, env: dict[str, str] | None = None, worker: bool = True) -> Iterator[Service]:
    server = RedisServer(root)
    svc = Service(server, root / "svc", env=env)
    try:
        svc.start_api()
        if worker:
            svc.start_worker()
        yield svc
    finally:
        svc.stop()
        server.stop()


def wait_ended(client: httpx.Client, job_id: str, timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        if job["status"] in ENDED or time.monotonic() > deadline:
            return job
        time.sleep(0.3)


def leftovers(folder: Path) -> list[str]:
    """Temporary files and folders a failed write may leave: `*.tmp` and `.upload-*.part`."""
    found = []
    for path in folder.rglob("*"):
        if path.name.endswith(".tmp") or path.name.endswith(".part"):
            found.append(str(path.relative_to(folder)))
    return sorted(found)


def phase_disk(root: Path) -> None:
    if os.geteuid() != 0:
        say("disk", "skipped: mounting a tmpfs needs root")
        return
    mount = root / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], check=True)
    try:
        # a reserve that fits the tiny disk (the default keeps 256 MiB free)
        env = {"PDPPO_ARTIFACT_DIR": str(mount), "PDPPO_MIN_FREE_BYTES": str(64 << 10)}
        with stack(root / "disk", env) as svc, svc.client() as alice:
            big = smoke_spec(steps=6, checkpoint_every=1, keep_checkpoints=10)
            big["train"]["model"]["tiny"].update(d_model=128, n_layers=4, max_seq_len=32)
            first = alice.post("/v1/jobs", json=big).json()
            job = wait_ended(alice, first["id"])
            failure = job.get("error") or {}
            say("disk", f"job 1: {job['status']} {failure.get('code')}: "
                        f"{str(failure.get('message'))[:150]}")  # fmt: skip
            say("disk", f"job 1: leftovers {leftovers(mount)}")
            second = alice.post("/v1/jobs", json=smoke_spec()).json()
            job2 = wait_ended(alice, second["id"])
            failure = job2.get("error") or {}
            say("disk", f"job 2 (small): {job2['status']} {failure.get('code')}: "
                        f"{str(failure.get('message'))[:150]}")  # fmt: skip
            body = os.urandom(4 << 20).hex().encode()[: 4 << 20]
            upload = alice.post(
                "/v1/files",
                files={"file": ("big.jsonl", body, "application/jsonl")},
                data={"purpose": "train"},
            )
            say("disk", f"upload of 4 MiB: HTTP {upload.status_code} {upload.text[:150]}")
            say("disk", f"after the upload: leftovers {leftovers(mount)}")
            ready = httpx.get(f"{svc.base_url}/readyz", timeout=10)
            say("disk", f"readyz: HTTP {ready.status_code} {ready.text[:160]}")
            for size in (64, 160):  # 6 checkpoints of ~11 MB are kept: 64 MiB holds 5
                subprocess.run(["mount", "-o", f"remount,size={size}m", str(mount)], check=True)
                resumed = alice.post(f"/v1/jobs/{first['id']}/resume")
                say("disk", f"space grown to {size} MiB; resume job 1: HTTP {resumed.status_code}")
                if resumed.status_code >= 300:
                    break
                job = wait_ended(alice, first["id"])
                failure = job.get("error") or {}
                say("disk", f"job 1 after resume: {job['status']} at step "
                            f"{job['progress']['step']} {failure.get('code') or ''} "
                            f"{str(failure.get('message') or '')[:300]}")  # fmt: skip
                saved = sorted(p.name for p in (mount / first["id"] / "checkpoints").iterdir())
                say("disk", f"job 1's checkpoints: {saved}; leftovers {leftovers(mount)}")
                if job["status"] == "succeeded":
                    break
            job3 = wait_ended(alice, alice.post("/v1/jobs", json=smoke_spec()).json()["id"])
            say("disk", f"job 3 (small, after): {job3['status']}")
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def phase_stall(root: Path, posts: int, sleep_s: float) -> None:
    env = {"PDPPO_MAX_ACTIVE_JOBS_PER_TENANT": "100000"}
    with stack(root / "stall", env, worker=False) as svc, svc.client() as alice:
        r = redis.Redis.from_url(svc.redis_url, socket_timeout=sleep_s + 30)
        answers: list[httpx.Response] = []
        stop = threading.Event()

        def post() -> None:
            """POSTs one after another from before the stall to after it: some are mid-write
            when Redis falls asleep."""
            spec = smoke_spec()
            spec["resources"] = {"device": "gpu"}  # no GPU worker: it stays queued, countable
            while not stop.is_set():
                with suppress(httpx.TransportError):
                    answers.append(alice.post("/v1/jobs", json=spec))

        threads = [threading.Thread(target=post) for _ in range(posts)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        sleeper = threading.Thread(target=lambda: r.execute_command("DEBUG", "SLEEP", sleep_s))
        sleeper.start()
        time.sleep(0.1)
        started = time.monotonic()
        ready = httpx.get(f"{svc.base_url}/readyz", timeout=30)
        readyz_s = time.monotonic() - started
        sleeper.join()
        stop.set()
        for t in threads:
            t.join()
        errors = [a for a in answers if a.status_code >= 500]
        created = [a.json()["id"] for a in answers if a.status_code == 201]
        ids: set[str] = set()
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 100, **({"cursor": cursor} if cursor else {})}
            page = alice.get("/v1/jobs", params=params).json()
            ids |= {j["id"] for j in page["items"]}
            if not (cursor := page["next_cursor"]):
                break
        hidden = len(ids - set(created))
        named = sum(1 for a in errors if "job_id" in a.text or a.headers.get("location"))
        say("stall", f"readyz during a {sleep_s:.0f} s stall: HTTP {ready.status_code} in "
                     f"{readyz_s:.1f} s")  # fmt: skip
        codes = sorted({a.status_code for a in errors})
        say("stall", f"{len(answers)} POSTs from {posts} clients: {len(created)} answered 201, "
                     f"{len(errors)} answered 5xx {codes}")  # fmt: skip
        say("stall", f"jobs that exist but were not answered 201: {hidden}; 5xx answers that "
                     f"named the job: {named} of {len(errors)}")  # fmt: skip


def phase_final(root: Path, jobs: int) -> None:
    advertised_running = served_running = served_cancelled = 0
    with stack(root / "final") as svc, svc.client() as alice:
        for _ in range(jobs):
            spec = smoke_spec(steps=4, checkpoint_every=2)
            spec["train"]["model"]["tiny"].update(d_model=256, n_layers=6)
            job_id = alice.post("/v1/jobs", json=spec).json()["id"]
            final = svc.artifact_dir / job_id / "final"
            deadline = time.monotonic() + 120
            while not final.exists() and time.monotonic() < deadline:
                time.sleep(0.002)
            worker = svc.workers[-1]
            for pid in subprocess.run(
                ["pgrep", "-g", str(os.getpgid(worker.pid))], capture_output=True, text=True
            ).stdout.split():
                with suppress(ProcessLookupError):
                    os.kill(int(pid), 9)
            worker.wait(10)
            job = alice.get(f"/v1/jobs/{job_id}").json()
            listing = alice.get(f"/v1/jobs/{job_id}/checkpoints").json()
            if job["status"] not in ENDED and listing.get("final_model_url"):
                advertised_running += 1
            if job["status"] not in ENDED and alice.get(f"/v1/jobs/{job_id}/model").is_success:
                served_running += 1
            alice.post(f"/v1/jobs/{job_id}/cancel")
            wait_ended(alice, job_id, 30)
            if alice.get(f"/v1/jobs/{job_id}/model").is_success:
                served_cancelled += 1
            svc.start_worker()
    say("final", f"{jobs} jobs killed as final/ appeared: final model advertised while running "
                 f"{advertised_running}, served while running {served_running}, served once "
                 f"cancelled {served_cancelled}")  # fmt: skip


async def _slow(host: str, port: int, head: bytes, drip: bytes, seconds: float) -> bool:
    """Sends `head` at once, then `drip` a byte a second; True if the server closed it first."""
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError:
        return True
    try:
        writer.write(head)
        await writer.drain()
        end = time.monotonic() + seconds
        for byte in drip:
            if time.monotonic() > end:
                return False
            writer.write(bytes([byte]))
            await writer.drain()
            try:
                if await asyncio.wait_for(reader.read(1024), 1.0) == b"":
                    return True
            except TimeoutError:
                continue
        return False
    except OSError:
        return True
    finally:
        writer.close()


async def _conns(url: str, bodies: int, headers: int, seconds: float) -> tuple[int, int, float]:
    host, port = url.removeprefix("http://").split(":")
    body_head = (
        f"POST /v1/jobs HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        "Content-Length: 100000\r\n\r\n"
    ).encode()
    header_head = f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n".encode()
    drip = b"x" * int(seconds + 5)
    tasks = [_slow(host, int(port), body_head, drip, seconds) for _ in range(bodies)]
    tasks += [_slow(host, int(port), header_head, drip, seconds) for _ in range(headers)]
    gathered = asyncio.gather(*tasks)
    await asyncio.sleep(min(5.0, seconds / 2))
    worst = 0.0
    async with httpx.AsyncClient(timeout=30) as client:
        for _ in range(5):
            started = time.monotonic()
            try:
                await client.get(f"{url}/healthz")
                worst = max(worst, time.monotonic() - started)
            except httpx.HTTPError:
                worst = float("inf")
            await asyncio.sleep(1)
    closed = await gathered
    return sum(closed[:bodies]), sum(closed[bodies:]), worst


def phase_conns(root: Path, bodies: int, headers: int, seconds: float) -> None:
    with stack(root / "conns", worker=False) as svc:
        closed_b, closed_h, worst = asyncio.run(_conns(svc.base_url, bodies, headers, seconds))
        say("conns", f"{bodies} slow bodies: {bodies - closed_b} still open after {seconds:.0f} s; "
                     f"{headers} slow headers: {headers - closed_h} still open")  # fmt: skip
        say("conns", f"a normal GET /healthz meanwhile: worst {worst:.2f} s of 5")
        host, port = svc.base_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20))
            sock.sendall(b"\r\n\r\n")
            try:
                status = sock.recv(64).split(b"\r\n")[0].decode() or "closed without an answer"
            except ConnectionResetError:
                status = "connection reset"
        say("conns", f"a 1 MiB request header: {status}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phases", default="disk,stall,final,conns")
    parser.add_argument("--stall-posts", type=int, default=5)
    parser.add_argument("--stall-seconds", type=float, default=15)
    parser.add_argument("--final-jobs", type=int, default=3)
    parser.add_argument("--slow-bodies", type=int, default=800)
    parser.add_argument("--slow-headers", type=int, default=300)
    parser.add_argument("--conn-wait", type=float, default=70)
    args = parser.parse_args()
    phases = args.phases.split(",")
    with tempfile.TemporaryDirectory(prefix="day-two-") as tmp:
        root = Path(tmp)
        if "disk" in phases:
            phase_disk(root)
        if "stall" in phases:
            phase_stall(root, args.stall_posts, args.stall_seconds)
        if "final" in phases:
            phase_final(root, args.final_jobs)
        if "conns" in phases:
            phase_conns(root, args.slow_bodies, args.slow_headers, args.conn_wait)


if __name__ == "__main__":
    main()
