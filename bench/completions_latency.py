"""Completions latency through the API on CPU: the first call to a job's model (cold: the sample
worker loads it) and warm calls (the model kept loaded), for a `builtin:tiny` job.

    python bench/completions_latency.py [--warm 10] [--max-tokens 16] [--n 1]

Starts redis-server, `pdppo serve`, a CPU training worker and `pdppo sample-worker` (as the
integration tests do), trains examples/smoke.yaml for 2 steps, then times
`POST /v1/jobs/{id}/completions` from the client's side (request sent to answer read), and prints
the server's own split (model load, generation) beside it. The prompt and settings are fixed
(greedy, so every call generates the same tokens); a call's total is queue pickup + load (cold
only) + generation + the two Redis hops.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.specs import smoke_spec  # noqa: E402
from tests.support.stack import RedisServer, Service  # noqa: E402


def call(client: Any, url: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    response = client.post(url, json=body)
    took = (time.perf_counter() - started) * 1000
    response.raise_for_status()
    return took, response.json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=10, help="warm calls (the median is reported)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--n", type=int, default=1)
    args = parser.parse_args()
    body = {"prompt": "12=", "max_tokens": args.max_tokens, "n": args.n, "temperature": 0}
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(Path(tmp) / "redis")
        svc = Service(redis, Path(tmp) / "service")
        try:
            svc.start_api()
            svc.start_worker("cpu")
            svc.start_sample_worker()
            with svc.client("alice") as client:
                job = client.post("/v1/jobs", json=smoke_spec(steps=2)).json()
                deadline = time.monotonic() + 180
                while client.get(f"/v1/jobs/{job['id']}").json()["status"] != "succeeded":
                    assert time.monotonic() < deadline, "the smoke job did not succeed"
                    time.sleep(0.2)
                url = f"/v1/jobs/{job['id']}/completions"
                cold_ms, cold = call(client, url, body)
                warm = [call(client, url, body) for _ in range(args.warm)]
        finally:
            svc.stop()
            redis.stop()
    assert cold["cold"] and not any(w[1]["cold"] for w in warm)
    warm_ms = [w[0] for w in warm]
    out = {
        "request": body,
        "completion_tokens": cold["usage"]["completion_tokens"],
        "cold": {"client_ms": round(cold_ms, 1), **cold["timings"]},
        "warm": {
            "calls": len(warm),
            "client_ms_median": round(statistics.median(warm_ms), 1),
            "client_ms_min": round(min(warm_ms), 1),
            "client_ms_max": round(max(warm_ms), 1),
            "generate_ms_median": round(
                statistics.median(w[1]["timings"]["generate_ms"] for w in warm), 1
            ),
        },
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
