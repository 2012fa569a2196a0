"""How long the dashboard's job page takes to show a long job, and what serving it costs the API.

A job with N steps of history (10,000 by default) is written to a real Redis through the workers'
own store calls (claim, one `publish_step` per step with a full set of metrics, finish), then a
headless Chromium (Debian's `chromium`, driven by Playwright: the `browser` extra) opens its page
on a real `pdppo serve`. Printed per try: seconds from navigation to all N steps drawn on the
eleven charts (the page replays the job's event stream from the start), how long one redraw of the
charts takes with N steps, and the API process's resident memory before and its peak (VmHWM)
after. Then, with N steps drawn, new steps arrive live (20 a second by default, for 10 s): how
late a 50 ms timer in the page runs meanwhile, which is how long a click or a key would wait.

    python bench/dashboard_load.py [--steps 10000] [--tries 3]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pdppo.store import JobStore
from tests.support.specs import smoke_spec
from tests.support.stack import KEYS, RedisServer, Service

METRICS = [
    *("reward_mean", "reward_std", "loss", "masked_fraction", "masked_fraction_pos"),
    *("masked_fraction_neg", "divergence_mean", "divergence_max", "direction_disagreement"),
    *("direction_disagreement_far", "masked_only_predictive", "masked_only_dppo"),
    *("offpolicy_logratio_abs", "entropy", "grad_norm", "lr", "delta_low", "delta_high"),
    *("zero_adv_groups", "response_len", "tokens_per_s", "rollout_time", "update_time"),
    "step_time",
]  # what a step of the default mask reports (tests/core/test_trainer.py REQUIRED and more)


def seed_job(service: Service, steps: int) -> tuple[str, JobStore]:
    """A running job with `steps` published steps, written as a worker would write them."""
    with httpx.Client(
        base_url=service.base_url, headers={"Authorization": f"Bearer {KEYS['alice']}"}
    ) as alice:
        job_id = str(alice.post("/v1/jobs", json=smoke_spec(steps=steps)).json()["id"])
    store = JobStore(redis.Redis.from_url(service.redis_url, decode_responses=True))
    assert store.claim(job_id, "bench")
    publish(store, job_id, range(1, steps + 1), steps)
    record = store.get(job_id)
    assert record is not None and record.step == steps
    return job_id, store


def publish(store: JobStore, job_id: str, steps: range, total: int, every: float = 0.0) -> None:
    rng = random.Random(steps.start)
    for step in steps:
        metrics = {name: rng.random() for name in METRICS}
        metrics["step"] = float(step)
        store.publish_step(job_id, step, total, metrics)
        time.sleep(every)


def memory_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def open_page(browser: object, service: Service, job_id: str, steps: int) -> tuple[Any, float]:
    """The page, and the seconds from navigation to every step drawn."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})  # type: ignore[attr-defined]
    page.goto(service.base_url + "/ui/")
    page.fill("#api-key", KEYS["alice"])
    page.click("#login")
    page.wait_for_selector("#spec")
    started = time.perf_counter()
    page.goto(f"{service.base_url}/ui/#/jobs/{job_id}")
    page.wait_for_function(f"() => window.pdppoDashboard.drawn >= {steps}", timeout=300_000)
    return page, time.perf_counter() - started


LAG_PROBE = """() => {
  window.lags = [];
  let last = performance.now();
  window.lagTimer = setInterval(() => {
    const now = performance.now();
    window.lags.push(now - last - 50);
    last = now;
  }, 50);
}"""


def live_lag(
    page: Any, store: JobStore, job_id: str, first: int, rate: float, seconds: float
) -> list[float]:
    """Event-loop delays (ms) of the page while `rate` new steps a second arrive for `seconds`."""
    page.evaluate(LAG_PROBE)
    count = int(rate * seconds)
    publish(store, job_id, range(first, first + count), first + count, every=1 / rate)
    page.wait_for_function(f"() => window.pdppoDashboard.drawn >= {first + count - 1}")
    lags = page.evaluate("() => { clearInterval(window.lagTimer); return window.lags; }")
    return sorted(float(lag) for lag in lags)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--tries", type=int, default=3)
    parser.add_argument("--rate", type=float, default=20, help="live steps per second")
    parser.add_argument("--chromium", default=os.environ.get("PDPPO_CHROMIUM") or "chromium")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    root = Path(tempfile.mkdtemp(prefix="pdppo-dashboard-"))
    redis_server = RedisServer(root)
    service = Service(redis_server, root / "service")
    try:
        service.start_api()
        assert service.api is not None
        t0 = time.perf_counter()
        job_id, store = seed_job(service, args.steps)
        print(f"seeded {args.steps} steps in {time.perf_counter() - t0:.1f} s")
        rss_before = memory_kib(service.api.pid, "VmRSS")
        chromium = shutil.which(args.chromium) or args.chromium
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            for attempt in range(1, args.tries + 1):
                page, seconds = open_page(browser, service, job_id, args.steps)
                redraw = float(page.evaluate("() => window.pdppoDashboard.drawMs"))
                print(
                    f"try {attempt}: {args.steps} steps drawn {seconds:.2f} s after navigation; "
                    f"a redraw of the charts on screen takes {redraw:.0f} ms"
                )
                page.close()
            page, _ = open_page(browser, service, job_id, args.steps)
            lags = live_lag(page, store, job_id, first=args.steps + 1, rate=args.rate, seconds=10)
            print(
                f"live, {args.rate:g} new steps/s on top of {args.steps}: the page's event loop "
                f"was late by {lags[len(lags) // 2]:.0f} ms (median), "
                f"{lags[int(len(lags) * 0.95)]:.0f} ms (p95), {lags[-1]:.0f} ms (max) on a 50 ms "
                f"timer; {page.evaluate('() => window.pdppoDashboard.drawn')} steps drawn"
            )
            browser.close()
        peak = memory_kib(service.api.pid, "VmHWM")
        print(
            f"API memory: {rss_before / 1024:.0f} MiB resident before, peak {peak / 1024:.0f} MiB "
            f"(+{(peak - rss_before) / 1024:.0f} MiB) over {args.tries} page loads"
        )
    finally:
        service.stop()
        redis_server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
