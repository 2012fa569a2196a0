"""Prometheus metrics of the gateway, served at `GET /metrics`.

Requests are labelled by route template (`/v1/jobs/{job_id}`), never by raw path, so that job ids
do not explode the series count, and by method from a fixed set (anything else is `other`):
`/metrics` needs no API key, and HTTP lets a client send any token as a method, so a label taken
from the request as is would let anyone add series without bound. A pure ASGI middleware,
because `BaseHTTPMiddleware` buffers and breaks streaming (SSE) responses.
"""

from __future__ import annotations

import time

from prometheus_client import Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HTTP_REQUESTS = Counter(
    "pdppo_http_requests_total", "HTTP requests by route and status", ["method", "route", "status"]
)
HTTP_LATENCY = Histogram(
    "pdppo_http_request_duration_seconds",
    "Time to the response's first byte",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
JOBS_SUBMITTED = Counter("pdppo_jobs_submitted_total", "Jobs created", ["queue"])
SSE_SUBSCRIBERS = Gauge("pdppo_sse_subscribers", "Open event streams")
SSE_FEEDS = Gauge("pdppo_sse_feeds", "Jobs with a live Redis reader fanning out events")
# The `method` label's values; any other method (case-sensitive, as HTTP says) is "other".
METHOD_LABELS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def method_label(method: str) -> str:
    return method if method in METHOD_LABELS else "other"


class PrometheusMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        first_byte: float | None = None

        async def send_wrapper(message: Message) -> None:
            nonlocal status, first_byte
            if message["type"] == "http.response.start":
                status = message["status"]
                first_byte = time.perf_counter() - start
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", "unmatched")
            method = method_label(scope["method"])
            HTTP_REQUESTS.labels(method, template, str(status)).inc()
            elapsed = first_byte if first_byte is not None else time.perf_counter() - start
            HTTP_LATENCY.labels(method, template).observe(elapsed)
