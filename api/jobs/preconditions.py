"""A job's `config_version` as its entity tag: `ETag` on `GET` and `PATCH /v1/jobs/{id}`, and the
`If-Match` precondition of `PATCH`.

A change is computed from the job a client read. Sent again after an ambiguous answer (a 503 whose
write may still land, a dropped connection), it would be made a second time over the first:
`config_version` +2 and the change logged twice. With `If-Match` naming the version it was
computed from, the store script refuses it once the version has moved (`precondition`, checked in
the same script as the write: `pdppo.store.jobs.steering`), and the route answers 412 with the
version the job is at; the client reads the job then and finds its change made
(`pdppo.client.Client.change`). The tag stands for the job's settings only, not its whole
record (its progress changes every step), and only `If-Match` reads it. A PATCH without
`If-Match` changes whatever version the job is at, as before.
"""

from __future__ import annotations

import re
from typing import Any

from api.schemas import VersionMismatchBody

_STRONG_TAG = re.compile(r'^"(\d{1,18})"$')

ETAG_HEADER: dict[str, Any] = {
    "ETag": {
        "description": 'the job\'s config_version, quoted (e.g. "3"): the If-Match of a change',
        "schema": {"type": "string"},
    }
}
PRECONDITION_RESPONSE: dict[int | str, dict[str, Any]] = {
    412: {
        "model": VersionMismatchBody,
        "description": (
            "If-Match names no version the job is at: it was changed since the change was "
            "computed (or that change already landed, e.g. a retry after a 503); nothing is "
            "changed. `config_version` (and the ETag header) is the version it is at"
        ),
        "headers": ETAG_HEADER,
    }
}


def etag(version: int) -> str:
    return f'"{version}"'


def if_match_versions(header: str | None) -> frozenset[int] | None:
    """The config versions an `If-Match` header names; None for no precondition (no header, or
    `*`: any version of the job, which exists). A weak tag (`W/"3"`) or anything that is not a
    quoted version names none: If-Match compares strongly (RFC 9110, 13.1.1)."""
    if header is None:
        return None
    tags = [tag.strip() for tag in header.split(",")]
    if "*" in tags:
        return None
    return frozenset(int(m.group(1)) for tag in tags if (m := _STRONG_TAG.match(tag)))


def mismatch_detail(job_id: str, version: int, asked: str) -> str:
    return (
        f"job {job_id!r} is at config_version {version}, not {asked}: it was changed since; read "
        "it again (its ETag) and compute the change over that"
    )
