"""A small synchronous Python client for the pdppo HTTP API.

It talks HTTP only (httpx, with httpx-sse for the event stream) and imports neither `api` nor
`workers`, so a laptop that submits jobs to a remote GPU box needs no server-side code paths.
The job JSON is kept as a permissive model: the server owns the schema, and a newer server that
adds fields must not break an older client.

`Client.follow` is the piece with a contract worth reading: it yields every event of a job's
stream once, in order, and survives dropped connections by reconnecting with `Last-Event-ID`, so
a flaky proxy or a restarted API costs a pause, not a gap or a duplicate.
"""

from __future__ import annotations

import builtins
import json
import os
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Self

import httpx
from httpx_sse import SSEError, connect_sse
from pydantic import BaseModel, ConfigDict, Field

from pdppo.client.errors import ApiError as ApiError
from pdppo.client.errors import detail_text as detail_text
from pdppo.client.errors import raise_for_status
from pdppo.client.experiments import ExperimentsMixin
from pdppo.client.files import FilesMixin
from pdppo.client.retry import RetryingWrites, merged_in
from pdppo.client.sampling import Completion as Completion
from pdppo.client.sampling import SamplingMixin
from pdppo.client.specs import SpecLike as SpecLike
from pdppo.client.specs import resolve_spec_paths as resolve_spec_paths
from pdppo.client.specs import spec_to_dict as spec_to_dict
from pdppo.client.specs import spec_yaml_dump as spec_yaml_dump
from pdppo.client.specs import spec_yaml_load as spec_yaml_load
from pdppo.client.storage import StorageMixin
from pdppo.client.webhooks import WebhooksMixin

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled"})
CHANGE_TRIES = 5  # changes of a job made over another client's change, before giving up


class FollowError(Exception):
    """The event stream could not be re-established after repeated attempts."""


class Progress(BaseModel):
    step: int = 0
    total: int = 0


class JobError(BaseModel):
    model_config = ConfigDict(extra="allow")

    code: str = ""
    message: str = ""
    traceback: str | None = None


class Job(BaseModel):
    """A job as the server describes it; unknown fields are kept, not rejected."""

    model_config = ConfigDict(extra="allow")

    id: str
    status: str
    name: str | None = None
    queue: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    spec: dict[str, Any] = Field(default_factory=dict)
    progress: Progress = Field(default_factory=Progress)
    metrics: dict[str, float] | None = None
    error: JobError | None = None
    cancel_requested: bool = False
    pause_requested: bool = False
    config_version: int = 0
    overrides: dict[str, Any] = Field(default_factory=dict)
    attempts: int = 0
    phase: dict[str, Any] | None = None  # {name, done, total} while running
    warnings: list[dict[str, str]] = Field(default_factory=list)  # [{code, message}] at the end

    @property
    def done(self) -> bool:
        return self.status in TERMINAL_STATUSES


class JobPage(BaseModel):
    """One page of `GET /v1/jobs`; pass `next_cursor` back to get the next page."""

    items: builtins.list[Job]
    next_cursor: str | None = None


class MetricsRow(BaseModel):
    step: int
    metrics: dict[str, float]


class Sample(BaseModel):
    """A prompt/completion/reward triple of a rollout (texts cut at 2000 characters)."""

    model_config = ConfigDict(extra="allow")

    prompt: str
    answer: str = ""
    completion: str
    reward: float
    truncated: bool = False


class SamplesRow(BaseModel):
    step: int
    samples: builtins.list[Sample]


class Checkpoint(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    step: int
    size_bytes: int = 0
    created_at: datetime | None = None
    download_url: str


class CheckpointList(BaseModel):
    items: builtins.list[Checkpoint]
    final_model_url: str | None = None


class ValidationProblem(BaseModel):
    """One reason the server would refuse a spec: the field, what it is, estimate and limit."""

    model_config = ConfigDict(extra="allow")

    field: str
    kind: str = ""
    message: str = ""
    estimate: int | None = None
    limit: int | None = None


class Validation(BaseModel):
    """`POST /v1/jobs:validate`: what a job would cost and whether `submit` would take it.

    `estimate` and `limits` are kept as plain JSON (the server owns their schema);
    `core.budget.render` and `render_limits` print them."""

    model_config = ConfigDict(extra="allow")

    ok: bool
    estimate: dict[str, Any] = Field(default_factory=dict)
    limits: dict[str, Any] = Field(default_factory=dict)
    problems: builtins.list[ValidationProblem] = Field(default_factory=builtins.list)


@dataclass(frozen=True)
class Event:
    """One server-sent event of a job's stream."""

    event: str
    data: str
    id: str | None = None

    def json(self) -> Any:
        """The payload decoded as JSON (every event the API sends carries JSON data)."""
        return json.loads(self.data) if self.data else None


class Client(
    RetryingWrites, FilesMixin, SamplingMixin, StorageMixin, WebhooksMixin, ExperimentsMixin
):
    """Sync client for one pdppo server and one API key (uploaded files: `FilesMixin`; deleting
    jobs and the tenant's usage: `StorageMixin`; webhook endpoints and their deliveries:
    `WebhooksMixin`; experiments: `ExperimentsMixin`).

    `base_url` and `api_key` default to the `PDPPO_URL` and `PDPPO_API_KEY` environment
    variables, the same ones the CLI reads.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        stream_read_timeout: float = 60.0,
        reconnect_delay: float = 0.5,
        max_reconnect_delay: float = 5.0,
        max_reconnects: int = 20,
        retry_seconds: float = 60.0,
        max_retry_delay: float = 5.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = (base_url or os.environ.get("PDPPO_URL") or DEFAULT_URL).rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("PDPPO_API_KEY")
        # The server pings idle streams every few seconds; a read that waits much longer than
        # that means the connection is dead even if TCP has not noticed yet.
        self.stream_read_timeout = stream_read_timeout
        # Doubling from reconnect_delay up to max_reconnect_delay: 20 tries ride out about a
        # minute of downtime (an API restart) without hammering a server that is coming up.
        self.reconnect_delay = reconnect_delay
        self.max_reconnect_delay = max_reconnect_delay
        self.max_reconnects = max_reconnects
        # Writes ride out a store stall or an API restart this long (`pdppo.client.retry`),
        # waiting what the server's Retry-After says, at most max_retry_delay between tries.
        self.retry_seconds = retry_seconds
        self.max_retry_delay = max_retry_delay
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        # Whether this server's API has answered anything but a 5xx yet (`follow`: a refusal or
        # a gateway's 502 after that is a restart to wait out, not a wrong URL or a server down).
        self._answered = False
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=timeout,
            transport=transport,
            event_hooks={"response": [self._saw_an_answer]},
        )

    def _saw_an_answer(self, response: httpx.Response) -> None:
        # A 5xx may come from a proxy in front of an API that is down, so it proves nothing.
        if response.status_code < 500:
            self._answered = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- plain requests --------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self._http.request(method, path, **kwargs)
        raise_for_status(response)
        return response

    def health(self) -> bool:
        """True when the API answers `/readyz` (its Redis is reachable)."""
        try:
            return self._http.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    def submit(self, spec: SpecLike, idempotency_key: str | None = None) -> Job:
        """Queues a job; with the same `idempotency_key` a retried submit returns the same job.

        Without one the client makes one, so that its own retries (through a store stall, a
        dropped connection) never make a second job. If it gives up, `ApiError.may_exist` names
        the jobs the server said it may have created, and the message the key to submit with
        again: the same spec with it returns that job, if any, or creates one."""
        key = idempotency_key or f"pdppo-{uuid.uuid4().hex}"
        response = self._write(
            "POST",
            "/v1/jobs",
            json=spec_to_dict(spec),
            headers={"Idempotency-Key": key},
            hint=f"; the same spec with Idempotency-Key {key} returns it, never a second",
        )
        return Job.model_validate(response.json())

    def validate(self, spec: SpecLike) -> Validation:
        """What the job would cost on its queue and every reason `submit` would refuse it
        (local paths, memory, parameters, tokens), without creating anything. A spec over
        budget is an answer (`ok` false, `problems`), not an error; a spec that is not a valid
        job spec at all raises `ApiError` (422)."""
        response = self._request("POST", "/v1/jobs:validate", json=spec_to_dict(spec))
        return Validation.model_validate(response.json())

    def get(self, job_id: str) -> Job:
        return Job.model_validate(self._request("GET", f"/v1/jobs/{job_id}").json())

    def list(
        self, status: str | None = None, limit: int = 20, cursor: str | None = None
    ) -> JobPage:
        """One page of this tenant's jobs, newest first."""
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = status
        if cursor:
            params["cursor"] = cursor
        return JobPage.model_validate(self._request("GET", "/v1/jobs", params=params).json())

    def iter_jobs(self, status: str | None = None, page_size: int = 50) -> Iterator[Job]:
        """Every job, walking the cursor pages."""
        cursor: str | None = None
        while True:
            page = self.list(status=status, limit=page_size, cursor=cursor)
            yield from page.items
            if not page.next_cursor or not page.items:
                return
            cursor = page.next_cursor

    def cancel(self, job_id: str) -> Job:
        """Asks for cancellation; a running job stops at its next step, a queued one never runs."""
        response = self._write(
            "POST", f"/v1/jobs/{job_id}/cancel", settled=lambda j: j.cancel_requested
        )
        return Job.model_validate(response.json())

    def change(
        self, job_id: str, patch: Mapping[str, Any], *, expected_version: int | None = None
    ) -> Job:
        """Changes a job's settings while it runs: `patch` is a JSON merge patch of its spec,
        e.g. {"train": {"optim": {"lr": 1e-4}}}; it applies at the job's next step.

        Each attempt names the `config_version` the change is made over (`If-Match`), so a
        retry after an answer that was lost (a 503 whose write landed later, a dropped
        connection) is refused by the server (412) instead of made a second time, and the job
        read again shows the change made. `expected_version`: the version the caller read and
        computed the change from; the job at another one raises `ApiError` (412). Without it,
        the job's version is read first, and a change another client made meanwhile is read
        again and this one made over it (merge patches compose)."""
        version = self.get(job_id).config_version if expected_version is None else expected_version
        for attempt in range(CHANGE_TRIES):
            try:
                response = self._write(
                    "PATCH",
                    f"/v1/jobs/{job_id}",
                    content=json.dumps(patch),
                    headers={
                        "Content-Type": "application/merge-patch+json",
                        "If-Match": f'"{version}"',
                    },
                    settled=lambda job: merged_in(job.overrides, patch),
                    settled_status=412,
                )
            except ApiError as exc:
                if exc.status_code != 412 or expected_version is not None:
                    raise
                if attempt == CHANGE_TRIES - 1:
                    raise
                version = self.get(job_id).config_version  # changed meanwhile: over that
                continue
            return Job.model_validate(response.json())
        raise AssertionError("unreachable")

    def pause(self, job_id: str) -> Job:
        """A running job stops at the next step boundary (or warm-up step), checkpoints there
        and releases its worker (status `paused`); `resume` continues from that checkpoint. A
        queued job is paused at once."""
        response = self._write(
            "POST",
            f"/v1/jobs/{job_id}/pause",
            settled=lambda j: j.status == "paused" or j.pause_requested,
        )
        return Job.model_validate(response.json())

    def resume(self, job_id: str) -> Job:
        """A paused job, or one that failed for its disk (storage_full, storage_error), is
        queued again and continues from its checkpoint."""
        response = self._write(
            "POST",
            f"/v1/jobs/{job_id}/resume",
            settled=lambda j: j.status in ("queued", "running") and not j.pause_requested,
        )
        return Job.model_validate(response.json())

    def metrics(self, job_id: str) -> builtins.list[MetricsRow]:
        """Every published step's metrics so far, oldest first."""
        body = self._request("GET", f"/v1/jobs/{job_id}/metrics").json()
        return [MetricsRow.model_validate(row) for row in body["items"]]

    def metrics_csv(self, job_id: str) -> str:
        return self._request("GET", f"/v1/jobs/{job_id}/metrics", params={"format": "csv"}).text

    def evaluations(self, job_id: str) -> builtins.list[MetricsRow]:
        """Every held-out evaluation so far (`train.eval_every`), oldest first."""
        body = self._request("GET", f"/v1/jobs/{job_id}/eval").json()
        return [MetricsRow.model_validate(row) for row in body["items"]]

    def samples(self, job_id: str, limit: int = 20) -> builtins.list[SamplesRow]:
        """The newest `limit` rows of rollout samples (`train.log_samples_every`), newest last."""
        body = self._request("GET", f"/v1/jobs/{job_id}/samples", params={"limit": limit}).json()
        return [SamplesRow.model_validate(row) for row in body["items"]]

    def checkpoints(self, job_id: str) -> CheckpointList:
        body = self._request("GET", f"/v1/jobs/{job_id}/checkpoints").json()
        return CheckpointList.model_validate(body)

    def download(self, job_id: str, name: str, dest: Path) -> Path:
        """Saves one checkpoint (a name from `checkpoints`, or "final" for the trained model).

        The server sends a .tar of the checkpoint folder; `dest` is a file or a folder. The
        file appears under its real name only once complete, so a dropped download never
        passes for a good one.
        """
        listing = self.checkpoints(job_id)
        if name == "final":
            if listing.final_model_url is None:
                raise ApiError(404, f"job {job_id} has no final model (yet)")
            url = listing.final_model_url
        else:
            match = [c for c in listing.items if c.name == name]
            if not match:
                known = ", ".join(c.name for c in listing.items) or "none"
                raise ApiError(404, f"job {job_id} has no checkpoint {name!r} (has: {known})")
            url = match[0].download_url
        return self._save(url, dest / f"{job_id}-{name}.tar" if dest.is_dir() else dest)

    def _save(self, url: str, target: Path) -> Path:
        """Streams `url` to `target`, which appears under its name only once complete."""
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".part")
        with self._http.stream("GET", url) as response:
            if response.status_code >= 400:
                response.read()
                raise_for_status(response)
            with partial.open("wb") as fh:
                for chunk in response.iter_bytes():
                    fh.write(chunk)
        partial.replace(target)
        return target

    # -- the event stream ------------------------------------------------------------------

    def follow(self, job_id: str, last_event_id: str | None = None) -> Iterator[Event]:
        """Yields the job's events until (and including) `done`.

        Starts after `last_event_id` when given (as a reconnecting browser would), else from
        the first event the server kept. A connection that drops or ends before `done` is
        re-opened with `Last-Event-ID`, so no event is lost or repeated; after
        `max_reconnects` attempts in a row without a single new event it raises FollowError.

        A first connection that cannot be made (refused, or timed out) is raised at once, as
        httpx's error, and a first answer that is a 5xx (a gateway's 502 with the API down
        behind it) as `ApiError`, as every other call does (`pdppo.client.retry`), unless the API
        has answered this client before (anything but a 5xx): then it is a restart, waited for
        (`pdppo submit --follow` across an API restart between its submit and its follow).
        Otherwise nothing has ever answered, so it is a wrong URL or a server that is down, not
        a blip worth a minute and a half of reconnects. The reconnects are bounded: doubling
        from `reconnect_delay` to `max_reconnect_delay`, `max_reconnects` in a row (about 90 s
        with the defaults); the FollowError then names the URL and what it last answered.
        """
        last = last_event_id
        delay = self.reconnect_delay
        failures = 0
        started = time.monotonic()
        timeout = httpx.Timeout(self._http.timeout.connect, read=self.stream_read_timeout)
        url = f"{self.base_url}/v1/jobs/{job_id}/events"
        while True:
            headers = {"Last-Event-ID": last} if last else {}
            reason = "the server closed the stream before `done`"
            try:
                with connect_sse(
                    self._http,
                    "GET",
                    f"/v1/jobs/{job_id}/events",
                    headers=headers,
                    timeout=timeout,
                ) as source:
                    response = source.response
                    if response.status_code >= 400:
                        response.read()
                        if response.status_code < 500 or not self._answered:
                            # a 4xx will not heal by retrying, nor is a 5xx from a server
                            # whose API never answered a restart to wait for
                            raise_for_status(response)
                        raise _ServerError(response)
                    for sse in source.iter_sse():
                        if sse.retry is not None:
                            delay = sse.retry / 1000
                        failures = 0
                        if sse.event == "message" and not sse.data:
                            # A keep-alive comment: httpx-sse reports the blank line after it
                            # as an empty event (it carries the last id, so one is set).
                            continue
                        if sse.id:
                            last = sse.id
                        event = Event(event=sse.event, data=sse.data, id=sse.id or None)
                        yield event
                        if event.event == "done":
                            return
            except (httpx.TransportError, SSEError, _ServerError) as exc:
                unsent = isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
                if unsent and not self._answered:
                    raise
                named = isinstance(exc, _ServerError)
                reason = f"answered {exc}" if named else f"{type(exc).__name__}: {exc}"
            failures += 1
            if failures > self.max_reconnects:
                raise FollowError(
                    f"gave up following job {job_id} after {failures - 1} reconnects in "
                    f"{time.monotonic() - started:.0f}s: GET {url}: {reason} "
                    f"(last event id {last!r})"
                )
            time.sleep(min(delay * 2 ** (failures - 1), self.max_reconnect_delay))


class _ServerError(Exception):
    """A 5xx on the stream of an API that has answered before: retried like a dropped
    connection, and said with its reason phrase (a gateway's 502 is not the API's 500)."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code} {response.reason_phrase}".rstrip())
