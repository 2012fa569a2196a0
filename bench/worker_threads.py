"""Two workers on one host, each running a job at once: their torch threads and step times.

Starts its own redis-server, `pdppo serve` and two `pdppo worker`s (the integration tests' stack),
then for each mode submits two identical CPU jobs at once and waits for both:
  fixed    PDPPO_WORKER_JOBS_AT_ONCE=1, each worker's count before it was counted on the host:
           each job takes every core, whatever runs beside it;
  counted  no setting: each job counts the jobs running on its host (`workers.job.cores`) and
           takes its share, updated at its step boundaries.
Prints, per mode and job, the thread counts its log said and its median step time over the steps
both jobs trained at the same time (`step_time` of the metrics rows; a step of one job while the
other still loaded its model or had ended does not count). No other setting of threads applies
(OMP_NUM_THREADS and PDPPO_JOB_THREADS are removed from the workers' environment).

    python bench/worker_threads.py [--steps 30 --prompts 8 --group 8 --modes fixed,counted]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pdppo.store import events_key
from tests.support.specs import smoke_spec
from tests.support.stack import RedisServer, Service

MODES = {"fixed": {"PDPPO_WORKER_JOBS_AT_ONCE": "1"}, "counted": {}}


def thread_lines(client: redis.Redis, job_id: str) -> list[str]:
    said = []
    for _, fields in client.xrange(events_key(job_id)):
        if fields["type"] == "log":
            message = json.loads(fields["data"])["message"]
            if message.startswith("torch threads: "):
                said.append(message)
    return said


def step_rows(client: redis.Redis, job_id: str) -> list[tuple[float, float]]:
    """(when the step was published, its step_time) per step, from the job's event stream (its
    ids are Redis's clock in ms)."""
    rows = []
    for entry_id, fields in client.xrange(events_key(job_id)):
        if fields["type"] == "metrics":
            at = int(entry_id.split("-")[0]) / 1000
            rows.append((at, float(json.loads(fields["data"])["metrics"]["step_time"])))
    return rows


def run_mode(root: Path, server: RedisServer, db: int, mode: str, args: Any) -> dict[str, Any]:
    svc = Service(server, root / mode, db=db, env=MODES[mode])
    for name in ("PDPPO_WORKER_TORCH_THREADS", "OMP_NUM_THREADS"):
        svc.env.pop(name, None)
    try:
        svc.start_api()
        svc.start_worker("cpu")
        svc.start_worker("cpu")
        spec = smoke_spec(steps=args.steps, checkpoint_every=0)
        spec["train"]["rollout"].update(prompts_per_step=args.prompts, group_size=args.group)
        with svc.client("alice") as alice:
            jobs = [alice.post("/v1/jobs", json=spec).json()["id"] for _ in range(2)]
            deadline = time.monotonic() + args.timeout
            while True:
                states = [alice.get(f"/v1/jobs/{j}").json()["status"] for j in jobs]
                if all(s in ("succeeded", "failed", "cancelled") for s in states):
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"{mode}: jobs did not end within {args.timeout}s: {states}")
                time.sleep(0.5)
        client = redis.Redis.from_url(svc.redis_url, decode_responses=True)
        rows = {j: step_rows(client, j) for j in jobs}
        # both training: from the later first step to the earlier last step
        start = max(r[0][0] for r in rows.values())
        end = min(r[-1][0] for r in rows.values())
        out = {"mode": mode, "states": states, "jobs": []}
        for j in jobs:
            both = [t for at, t in rows[j] if start <= at <= end]
            out["jobs"].append(
                {
                    "threads": thread_lines(client, j),
                    "steps_together": len(both),
                    "median_step_s": statistics.median(both) if both else None,
                }
            )
        client.close()
        return out
    finally:
        svc.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--modes", default="fixed,counted")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    print(f"cores (affinity): {cores}; 2 workers, 2 jobs at once; {args.steps} steps, "
          f"{args.prompts}x{args.group} completions a step")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="pdppo-threads-") as tmp:
        server = RedisServer(Path(tmp))
        try:
            for db, mode in enumerate(args.modes.split(","), start=1):
                result = run_mode(Path(tmp), server, db, mode, args)
                for n, job in enumerate(result["jobs"], start=1):
                    median = job["median_step_s"]
                    shown = f"{median:.3f} s" if median is not None else "-"
                    print(
                        f"{mode:8s} job {n}: median step {shown} over {job['steps_together']} "
                        f"steps trained together; {result['states'][n - 1]}; "
                        f"threads said: {' -> '.join(job['threads'])}"
                    )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
