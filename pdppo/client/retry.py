"""Retrying a write through a store stall without doing it twice (`pdppo.client.Client`).

A 503 is not always "nothing happened": when the server's store stopped answering after the
write was sent, the write may still land, and the 503 says so by naming the job, file or
experiment (`Pdppo-Job-Id` / `Pdppo-File-Id` / `Pdppo-Experiment-Id`; see
`api.jobs.pending_writes`). A dropped connection or a read
timeout is ambiguous the same way. So the client retries only writes a second copy of which
changes nothing: a submit carries an Idempotency-Key (the client makes one when the caller gave
none), an upload is stored by its content, a change carries the version it was computed from
(`If-Match`: a retry whose first attempt landed is refused with 412, and the job read again shows
the change made), and a cancel, pause or resume that already landed is recognised by the job's
state (`settle`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from pdppo.client.errors import ApiError, detail_text, raise_for_status

if TYPE_CHECKING:
    from pdppo.client import Job

NAMING_HEADERS = ("Pdppo-Job-Id", "Pdppo-File-Id", "Pdppo-Experiment-Id")
log = logging.getLogger("pdppo.client")


@dataclass
class Sent:
    """The last answer of a retried write, and what the attempts before it may have done."""

    response: httpx.Response
    named: list[str] = field(default_factory=list)
    """Ids the 503s named (a job or file the write may have created or changed), in order."""
    ambiguous: bool = False
    """True if an earlier attempt may have landed: a naming 503, a drop or a read timeout."""


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail", ""))
    except (ValueError, AttributeError):
        return response.text[:200]


def _retry_after(response: httpx.Response, default: float) -> float:
    raw = response.headers.get("Retry-After", "")
    try:
        return max(float(raw), 0.0)
    except ValueError:
        return default


def send_with_retry(
    send: Callable[[], httpx.Response],
    *,
    budget: float,
    max_delay: float,
    what: str = "the request",
    sleep: Callable[[float], object] = time.sleep,
) -> Sent:
    """`send()` again after each 503 or transport error until it gets another answer or
    `budget` seconds have passed since the first try (then the last 503 is returned, or the last
    transport error raised). Waits what `Retry-After` says, at most `max_delay` seconds. A
    first try that cannot connect is raised at once. The first retry is logged (a warning: the
    CLI, which configures no logging, prints it), so a wait is never silent."""
    deadline = time.monotonic() + budget
    named: list[str] = []
    ambiguous = False
    failures = 0
    while True:
        try:
            response = send()
        except httpx.TransportError as exc:
            unsent = isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
            if time.monotonic() >= deadline or (unsent and not failures):
                # A first try that could not connect sent nothing: a wrong URL or a server that
                # is down is said at once, not after a minute of silent retries.
                raise
            # Anything after the connect may have reached the server.
            ambiguous = ambiguous or not unsent
            delay = min(0.25 * 2**failures, max_delay)
            reason = f"{type(exc).__name__}: {exc}"
        else:
            if response.status_code != 503:
                return Sent(response, named, ambiguous)
            for header in NAMING_HEADERS:
                ident = response.headers.get(header)
                if ident:
                    ambiguous = True
                    if ident not in named:
                        named.append(ident)
            if time.monotonic() >= deadline:
                return Sent(response, named, ambiguous)
            delay = min(_retry_after(response, 1.0), max_delay)
            reason = f"HTTP 503: {_detail(response)}"
        if not failures:
            log.warning("%s: %s; retrying for up to %.0fs", what, reason, budget)
        failures += 1
        sleep(max(0.0, min(delay, deadline - time.monotonic())))


class RetryingWrites:
    """`Client._write`: a write retried as above. Mixed into `Client`, which supplies `_http`,
    `get` and the retry settings."""

    if TYPE_CHECKING:
        _http: httpx.Client
        retry_seconds: float
        max_retry_delay: float

        def get(self, job_id: str) -> Job: ...

    def _write(
        self,
        method: str,
        path: str,
        *,
        settled: Callable[[Job], bool] | None = None,
        settled_status: int = 409,
        hint: str = "",
        prepare: Callable[[], dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """A write the caller knows is safe to send twice, retried through 503s and dropped
        connections. `settled`: after an attempt that may have landed, a `settled_status`
        answer (409: the job is past it; 412: its If-Match version is gone) is the write having
        landed when the job, read again, passes it. `hint` ends the error of a write that may
        have landed: what to do about it. `prepare`: more arguments made again for each try (a
        file rewound)."""
        sent = send_with_retry(
            lambda: self._http.request(method, path, **kwargs, **(prepare() if prepare else {})),
            budget=self.retry_seconds,
            max_delay=self.max_retry_delay,
            what=f"{method} {path}",
        )
        response = sent.response
        if response.status_code == settled_status and sent.ambiguous and settled is not None:
            job = self.get(path.split("/")[3])
            if settled(job):
                body = job.model_dump(mode="json")
                return httpx.Response(202, json=body, request=response.request)
        if response.status_code >= 400 and sent.named:
            try:
                raise_for_status(response)
            except ApiError as exc:
                named = ", ".join(sent.named)
                raise ApiError(
                    exc.status_code,
                    f"{detail_text(exc.detail)} (may exist: {named}{hint})",
                    exc.method,
                    exc.url,
                    may_exist=sent.named,
                ) from None
        raise_for_status(response)
        return response


def merged_in(target: Mapping[str, Any], patch: Mapping[str, Any]) -> bool:
    """Whether the JSON merge patch `patch` (RFC 7396) changes nothing of `target`: a change is
    in a job's cumulative `overrides` when applying it again would leave them as they are."""
    for key, value in patch.items():
        if value is None:
            if key in target:
                return False
        elif isinstance(value, Mapping):
            inner = target.get(key)
            if not isinstance(inner, Mapping) or not merged_in(inner, value):
                return False
        elif key not in target or target[key] != value:
            return False
    return True
