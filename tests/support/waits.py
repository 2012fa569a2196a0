"""Waiting on the real service: polls of a job's JSON until a predicate holds (the last answer in
the timeout's message), and its event stream read whole."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
from httpx_sse import connect_sse

TERMINAL = {"succeeded", "failed", "cancelled"}


def wait_path(
    client: httpx.Client,
    path: str,
    predicate: Callable[[dict[str, Any]], bool],
    timeout: float = 60,
    interval: float = 0.05,
) -> dict[str, Any]:
    """GET `path` until its JSON satisfies `predicate`; the last answer is in the timeout's
    message, so a test that gives up says what it saw."""
    deadline = time.monotonic() + timeout
    while True:
        got: dict[str, Any] = client.get(path).json()
        if predicate(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting on {path}: {got}")
        time.sleep(interval)


def wait_for(
    client: httpx.Client,
    job_id: str,
    predicate: Callable[[dict[str, Any]], bool],
    timeout: float = 60,
) -> dict[str, Any]:
    return wait_path(client, f"/v1/jobs/{job_id}", predicate, timeout)


def wait_status(
    client: httpx.Client, job_id: str, statuses: set[str] | str, timeout: float = 60
) -> dict[str, Any]:
    wanted = {statuses} if isinstance(statuses, str) else statuses
    return wait_for(client, job_id, lambda job: job["status"] in wanted, timeout)


def handled(log: str, job_id: str) -> bool:
    """The worker got the task and is done with it (ran the skip, or discarded it as revoked)."""
    return f"job {job_id}: " in log or f"revoked task: pdppo.train[{job_id}]" in log


def read_events(
    client: httpx.Client,
    job_id: str,
    *,
    last_event_id: str | None = None,
    limit: int | None = None,
    timeout: float = 120,
) -> list[dict[str, Any]]:
    """Events as {id, event, data} until `done` (the server closes) or `limit` events."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    out: list[dict[str, Any]] = []
    with connect_sse(
        client, "GET", f"/v1/jobs/{job_id}/events", headers=headers, timeout=timeout
    ) as source:
        assert source.response.status_code == 200, source.response.read()
        for sse in source.iter_sse():
            if not sse.event or sse.event == "message":
                continue  # comments (pings) are not events
            out.append({"id": sse.id, "event": sse.event, "data": json.loads(sse.data)})
            if limit is not None and len(out) >= limit:
                break
    return out


def metric_steps(events: list[dict[str, Any]]) -> list[int]:
    return [e["data"]["step"] for e in events if e["event"] == "metrics"]


def every_step_once(client: httpx.Client, job_id: str, steps: int) -> list[dict[str, Any]]:
    """Asserts that the job's metrics rows and its event stream each hold steps 1..`steps` once,
    in order (what a resumed or interrupted job owes); returns the events for further checks."""
    history = client.get(f"/v1/jobs/{job_id}/metrics").json()["items"]
    assert [row["step"] for row in history] == list(range(1, steps + 1))
    events = read_events(client, job_id)
    assert metric_steps(events) == list(range(1, steps + 1))
    return events
