"""Webhook delivery figures on the real stack: how soon an event reaches its receiver after a job
ends, how many arrive, and when they arrive after the receiver was down for a while.

    python bench/webhook_delivery.py [--jobs 20] [--down-minutes 2] [--schedule default]

Starts redis-server, `pdppo serve`, a CPU worker and `pdppo webhook-worker` (as the integration
tests do), and a local receiver that checks every signature with the `standardwebhooks` library.
Two phases:

1. up: the receiver answers; `--jobs` jobs are submitted and cancelled (a cancel ends a queued
   job at once, so the phase measures delivery, not training) and one trains to the end; each
   end's `job.*` event is timed from the job's `finished_at` to its arrival.
2. down: the receiver answers 503 for `--down-minutes`, then 200; one job is cancelled at the
   start; the event's attempts, and when it arrived after the receiver came back, are counted.
   With the default schedule (retries after 5 s, 5 min, 30 min, ...) the event arrives at the
   first retry after the receiver is back: 5 min 5 s after the end for a receiver down 2 min.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from standardwebhooks import Webhook  # noqa: E402

from pdppo.webhooks import DEFAULT_SCHEDULE, parse_schedule  # noqa: E402
from tests.support.specs import smoke_spec  # noqa: E402
from tests.support.stack import RedisServer, Service  # noqa: E402
from tests.support.webhook_receiver import Receiver  # noqa: E402

ENDS = ["job.succeeded", "job.failed", "job.cancelled"]


class Outage(Receiver):
    """A receiver whose `/down` answers 503 until `up_at` (time.time()), then 200."""

    up_at: float = 0.0

    def answer(self, path: str) -> int:
        if path.startswith("/down"):
            return 503 if time.time() < self.up_at else 200
        return super().answer(path)


def finished(client: Any, job: str) -> float:
    body = client.get(f"/v1/jobs/{job}").json()
    return datetime.fromisoformat(body["finished_at"]).timestamp()


def wait_until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out: {what}")
        time.sleep(0.05)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--down-minutes", type=float, default=2.0)
    parser.add_argument(
        "--schedule", default="default", help="PDPPO_WEBHOOK_RETRY_SCHEDULE, or 'default'"
    )
    args = parser.parse_args()
    schedule = ",".join(f"{d:g}" for d in DEFAULT_SCHEDULE)
    if args.schedule != "default":
        schedule = args.schedule

    root = Path(tempfile.mkdtemp(prefix="pdppo-webhooks-"))
    redis = RedisServer(root)
    env = {
        "PDPPO_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8",
        "PDPPO_WEBHOOK_RETRY_SCHEDULE": schedule,
        "PDPPO_MAX_ACTIVE_JOBS_PER_TENANT": str(args.jobs + 2),
    }
    svc = Service(redis, root / "service", env=env)
    receiver = Outage()
    receiver.start()
    try:
        svc.start_api()
        svc.start_worker("cpu")
        svc.start_webhook_worker()
        with svc.client("alice") as alice:
            hook = alice.post(
                "/v1/webhooks", json={"url": f"{receiver.url}/up", "events": ENDS}
            ).json()
            jobs = []
            for _ in range(args.jobs):
                job = alice.post("/v1/jobs", json=smoke_spec(steps=200)).json()["id"]
                alice.post(f"/v1/jobs/{job}/cancel")
                jobs.append(job)
            trained = alice.post("/v1/jobs", json=smoke_spec(steps=4)).json()["id"]
            jobs.append(trained)
            wait_until(
                lambda: len(receiver.at("/up")) >= len(jobs), 300, "every end's event arrived"
            )
            arrivals: dict[str, float] = {}
            up_requests = len(receiver.at("/up"))  # before the next phase's job ends too
            for one in receiver.at("/up"):
                body = Webhook(hook["secret"]).verify(one.body, one.headers)
                arrivals.setdefault(body["data"]["id"], one.at)
            latencies = sorted(arrivals[job] - finished(alice, job) for job in jobs)

            down = alice.post(
                "/v1/webhooks", json={"url": f"{receiver.url}/down", "events": ENDS}
            ).json()
            receiver.up_at = time.time() + args.down_minutes * 60
            job = alice.post("/v1/jobs", json=smoke_spec(steps=200)).json()["id"]
            alice.post(f"/v1/jobs/{job}/cancel")
            ended = wait_until(
                lambda: alice.get(f"/v1/jobs/{job}").json().get("finished_at"), 60, "end"
            )
            ended_at = datetime.fromisoformat(ended).timestamp()
            limit = args.down_minutes * 60 + sum(parse_schedule(schedule)) + 60
            got = wait_until(
                lambda: [r for r in receiver.at("/down") if r.status == 200], limit, "recovery"
            )
            attempts = receiver.at("/down")
            for one in attempts:  # checked as sent: the library's own check refuses an old one
                signed_at = int(one.headers["webhook-timestamp"])
                assert abs(signed_at - one.at) < 5, "signed long before it was sent"
                expected = Webhook(down["secret"]).sign(
                    one.headers["webhook-id"],
                    datetime.fromtimestamp(signed_at, UTC),
                    one.body.decode(),
                )
                assert one.headers["webhook-signature"] == expected
            record = alice.get(f"/v1/webhooks/{down['id']}/deliveries").json()["items"][0]
    finally:
        receiver.stop()
        svc.stop()
        redis.stop()

    print(f"schedule (s): {schedule}")
    print(
        f"up: {len(arrivals)} of {len(jobs)} job ends delivered, "
        f"{up_requests - len(jobs)} delivered more than once"
    )
    print(
        f"up: end -> arrival  median {statistics.median(latencies) * 1000:.0f} ms, "
        f"max {latencies[-1] * 1000:.0f} ms (n={len(latencies)})"
    )
    print(
        f"down {args.down_minutes:g} min: {len(attempts)} attempts "
        f"({', '.join(str(a.status) for a in attempts)}), delivered "
        f"{got[0].at - ended_at:.1f} s after the job ended, "
        f"{got[0].at - receiver.up_at:.1f} s after the receiver came back; "
        f"API says {record['status']} after {record['attempts']} attempts"
    )


if __name__ == "__main__":
    main()
