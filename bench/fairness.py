"""Fair scheduling on the real stack: a tenant's steady stream of plain jobs against another
tenant's experiment, on one worker. How long each tenant's jobs wait, and each one's share of the
worker's time.

    python bench/fairness.py [--seconds 120] [--backlog 4] [--seeds 2] [--steps 2]

Starts redis-server, `pdppo serve` and one CPU worker (as the integration tests do). Bob submits
`--backlog` plain jobs and keeps that many queued, submitting one each time one of his starts;
once his first job runs, alice submits an experiment (2 arms x `--seeds` seeds). For `--seconds`
from then (the window) bob keeps his stream up; then he stops submitting and the run waits for
every job to end. Jobs are examples/smoke.yaml with `--steps` steps.

Printed per tenant: jobs started in the window, their waits (created -> started: median, max),
and their share of the worker's time in the window; for alice, when her first and last child
started after the experiment was made. Before the fair order (`pdppo.store.jobs.fair`), every one
of bob's plain jobs went before any child (their Celery priority): alice's children started only
after bob stopped, and her share of the window was 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.specs import smoke_spec  # noqa: E402
from tests.support.stack import RedisServer, Service  # noqa: E402

ENDED = {"succeeded", "failed", "cancelled"}


def stamp(value: str | None) -> float | None:
    return datetime.fromisoformat(value).timestamp() if value else None


def job_times(client: httpx.Client, job_ids: list[str]) -> list[dict[str, Any]]:
    out = []
    for job_id in job_ids:
        body = client.get(f"/v1/jobs/{job_id}").json()
        out.append(
            {
                "id": job_id,
                "status": body["status"],
                "created": stamp(body["created_at"]),
                "started": stamp(body.get("started_at")),
                "finished": stamp(body.get("finished_at")),
            }
        )
    return out


def busy_in(jobs: list[dict[str, Any]], start: float, end: float) -> float:
    """Seconds of [start, end] the jobs ran (started to finished, or to `end`)."""
    total = 0.0
    for job in jobs:
        if job["started"] is None:
            continue
        ran_to = job["finished"] or end
        total += max(0.0, min(ran_to, end) - max(job["started"], start))
    return total


def report(name: str, jobs: list[dict[str, Any]], start: float, end: float) -> str:
    started = [j for j in jobs if j["started"] is not None and start <= j["started"] <= end]
    waits = sorted(j["started"] - j["created"] for j in started)
    share = busy_in(jobs, start, end) / (end - start)
    wait_text = (
        f"wait median {statistics.median(waits):.1f} s, max {waits[-1]:.1f} s"
        if waits
        else "no wait measured"
    )
    return f"{name}: {len(started)} of {len(jobs)} jobs started in the window, {wait_text}; " + (
        f"share of the worker's time {share:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--backlog", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    spec = smoke_spec(steps=args.steps, checkpoint_every=0)
    children = 2 * args.seeds

    root = Path(tempfile.mkdtemp(prefix="pdppo-fairness-"))
    redis = RedisServer(root)
    limit = str(args.backlog + children + 4)
    svc = Service(redis, root / "service", env={"PDPPO_MAX_ACTIVE_JOBS_PER_TENANT": limit})
    try:
        svc.start_api()
        svc.start_worker("cpu")
        with svc.client("alice") as alice, svc.client("bob") as bob:
            bobs = [bob.post("/v1/jobs", json=spec).json()["id"] for _ in range(args.backlog)]
            deadline = time.monotonic() + 120
            while bob.get(f"/v1/jobs/{bobs[0]}").json()["status"] == "queued":
                if time.monotonic() > deadline:
                    raise SystemExit(f"bob's first job never started: {svc.worker_log()[-2000:]}")
                time.sleep(0.1)
            body = {
                "base": spec,
                "grid": {"algorithm.mask": ["predictive", "dppo"]},
                "seeds": args.seeds,
            }
            made = alice.post("/v1/experiments", json=body)
            assert made.status_code == 201, made.text
            window_start = time.time()
            kids = [run["job_id"] for arm in made.json()["arms"] for run in arm["runs"]]
            window_end = window_start + args.seconds
            while time.time() < window_end:  # bob keeps `backlog` jobs queued
                queued = bob.get("/v1/jobs", params={"status": "queued", "limit": 100}).json()
                for _ in range(args.backlog - len(queued["items"])):
                    bobs.append(bob.post("/v1/jobs", json=spec).json()["id"])
                time.sleep(0.25)
            deadline = time.monotonic() + 20 * 60
            while True:  # bob stopped: everything queued runs to its end
                statuses = [bob.get(f"/v1/jobs/{j}").json()["status"] for j in bobs]
                statuses += [alice.get(f"/v1/jobs/{j}").json()["status"] for j in kids]
                if all(s in ENDED for s in statuses) or time.monotonic() > deadline:
                    break
                time.sleep(1.0)
            bob_jobs, alice_jobs = job_times(bob, bobs), job_times(alice, kids)
    finally:
        svc.stop()
        redis.stop()

    print(
        f"one CPU worker; bob keeps {args.backlog} plain jobs queued, alice's experiment has "
        f"{children} children; smoke jobs of {args.steps} steps; a window of "
        f"{args.seconds:g} s from the experiment's creation"
    )
    print(report("bob  ", bob_jobs, window_start, window_end))
    print(report("alice", alice_jobs, window_start, window_end))
    starts = sorted(j["started"] - window_start for j in alice_jobs if j["started"] is not None)
    in_window = [s for s in starts if s <= args.seconds]
    print(
        f"alice's children: {len(in_window)} of {children} started in the window; the first "
        + (f"{starts[0]:.1f} s" if starts else "never")
        + " and the last "
        + (f"{starts[-1]:.1f} s" if len(starts) == children else "never")
        + " after the experiment was made"
        + ("" if len(in_window) == children else " (after bob stopped submitting)")
    )
    running = [j for j in bob_jobs if j["started"] and j["started"] < window_start]
    ends = [j["finished"] - window_start for j in running if j["finished"]]
    print(
        "bob's job running when the experiment was made ended "
        + (f"{max(ends):.1f} s after it" if ends else "(none ran)")
    )
    first = window_start + starts[0] if starts else float("inf")
    ahead = sum(1 for j in bob_jobs if j["started"] and window_start <= j["started"] < first)
    print(f"bob's jobs started after the experiment was made and before its first child: {ahead}")


if __name__ == "__main__":
    main()
