"""A store write whose answer never came: the 503 says which job, file or experiment it may have
changed.

A Redis command that times out has still been sent: Redis runs it when it wakes (a stalled
server reads the abandoned connection's buffer like any other), so a `POST /v1/jobs` that times
out may have created its job, which then runs. A plain 503 would read as "not created", and a
client retrying it without an Idempotency-Key would get a duplicate (issue 37). So a route marks
the job, file or experiment a write is about to touch (`pending_write`) just before sending it,
and the 503 of a store error that follows names it, in the body (`job_id` / `file_id` /
`experiment_id`) and a header (`Pdppo-Job-Id` / `Pdppo-File-Id` / `Pdppo-Experiment-Id`): the
client can look it up once the store is back, or retry with the same Idempotency-Key and get
that job, not a second one.

Only a lost answer is ambiguous: a refused command (`ResponseError`: a script error, OOM) ran
nothing, and a store error before the mark (a read, the job lookup) wrote nothing, so those 503s
name nothing.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import redis
from fastapi import Request
from fastapi.responses import JSONResponse

from api.schemas import StoreUnavailableBody

log = logging.getLogger(__name__)
Kind = Literal["job", "file", "experiment"]
HEADERS: dict[Kind, str] = {
    "job": "Pdppo-Job-Id",
    "file": "Pdppo-File-Id",
    "experiment": "Pdppo-Experiment-Id",
}
RETRY_AFTER_SECONDS = 5
_LOST_ANSWER = (redis.ConnectionError, redis.TimeoutError)


def pending_write(request: Request, kind: Kind, ident: str, what: str) -> None:
    """Marks that this request is about to send a write to `kind` `ident`; `what` completes
    "... may still take effect" in the 503's detail (e.g. "the cancel of job X")."""
    request.state.pending_write = (kind, ident, what)


def idempotent_retry(request: Request, outcome: str) -> None:
    """Marks a create that a retry with the same Idempotency-Key makes safe: `outcome` completes
    "a retry with the same Idempotency-Key ..." in its 503's detail (e.g. "returns that job,
    never a second"), so the client that would otherwise fear a duplicate knows how to go on.
    Set by the route itself, as only it knows what its key replays."""
    request.state.idempotent_retry = outcome


def unavailable_response(request: Request, exc: Exception) -> JSONResponse:
    """The 503 of a store error, naming what a write sent before it may have done."""
    log.warning("Redis error on %s %s: %s", request.method, request.url.path, exc)
    body: dict[str, Any] = {"detail": "the job store is unavailable; try again shortly"}
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    pending: tuple[Kind, str, str] | None = getattr(request.state, "pending_write", None)
    if pending is not None and isinstance(exc, _LOST_ANSWER):
        kind, ident, what = pending
        retry: str | None = getattr(request.state, "idempotent_retry", None)
        body["detail"] = (
            f"the job store did not answer in time; {what} may still take effect when it "
            f"does (GET /v1/{kind}s/{ident} tells, once it answers)"
            + (f", and a retry with the same Idempotency-Key {retry}" if retry else "")
        )
        body[f"{kind}_id"] = ident
        headers[HEADERS[kind]] = ident
    return JSONResponse(
        StoreUnavailableBody.model_validate(body).model_dump(exclude_none=True),
        status_code=503,
        headers=headers,
    )


def documented_503(
    kind: Kind | tuple[Kind, ...], what: str, also: str = ""
) -> dict[int | str, dict[str, Any]]:
    """The `responses=` entry of a route whose 503 may name the `kind` (or one of the kinds) it
    was writing; `also`: the route's other reasons for a 503."""
    kinds = (kind,) if isinstance(kind, str) else kind
    fields = " or ".join(f"`{k}_id`" for k in kinds)
    headers = " / ".join(f"`{HEADERS[k]}`" for k in kinds)
    return {
        503: {
            "model": StoreUnavailableBody,
            "description": (
                f"the job store (Redis) is unreachable; retry after `Retry-After` seconds. With "
                f"{fields} (and the {headers} header), the store stopped answering after the "
                f"write was sent: {what}; look it up before acting as if it did not"
                + (f". {also}" if also else "")
            ),
            "headers": {
                **{
                    HEADERS[k]: {
                        "description": f"the {k} the unanswered write was for",
                        "schema": {"type": "string"},
                    }
                    for k in kinds
                },
                "Retry-After": {
                    "description": "seconds to wait before retrying",
                    "schema": {"type": "integer"},
                },
            },
        }
    }
