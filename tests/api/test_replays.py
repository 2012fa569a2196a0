"""A create retried with its Idempotency-Key is answered as the replay it is, before any check
that refuses a NEW job (issue 49, point 8): the storage quota (507), the tenant's active-job limit
(429), the queue's budget and the files the spec names (422; 400 on the OpenAI route). Those
checks may have changed since the first answer (a checkpoint written, a limit lowered, a file
deleted), and a client retrying a create whose answer it lost must get the job it made, not a
refusal that reads as "no job".

A table of check x route, each row through the real app (in-process over ASGI) and a real
redis-server: the create, then the check made to refuse (shown by a create with a new key),
then the retry with the first key. Before, `POST /v1/jobs` answered the retry 507, 422 or 422,
as the experiment and OpenAI creates did (the quota and admission ran before the key's lookup)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from pdppo.settings import Settings
from tests.support.inprocess import Request, send, upload
from tests.support.openai_inprocess import GRADER, SMALL
from tests.support.openai_inprocess import ROWS as OPENAI_ROWS
from tests.support.specs import records, smoke_spec


@dataclass(frozen=True)
class Route:
    path: str
    created: int  # the status of a create, new or replayed
    refused: dict[str, int]  # check -> the status a new create gets once the check refuses
    body: Callable[[str], dict[str, Any]]  # the request body, given the uploaded file's id
    content: bytes  # the file the body names
    cancel: Callable[[dict[str, Any]], list[str]]  # paths that end what the create made

    def job_ids(self, answer: dict[str, Any]) -> list[str]:
        if "arms" in answer:
            return [run["job_id"] for arm in answer["arms"] for run in arm["runs"]]
        return [answer["id"].removeprefix("ftjob-")]


def _job_spec(file_id: str) -> dict[str, Any]:
    spec = smoke_spec(steps=2)
    spec["train"]["task"] = {"name": "jsonl", "file": file_id}
    return spec


ROUTES: dict[str, Route] = {
    "jobs": Route(
        path="/v1/jobs",
        created=201,
        refused={"storage": 507, "active": 429, "budget": 422, "file": 422},
        body=_job_spec,
        content=records(8),
        cancel=lambda made: [f"/v1/jobs/{made['id']}/cancel"],
    ),
    "experiments": Route(
        path="/v1/experiments",
        created=201,
        refused={"storage": 507, "active": 429, "budget": 422, "file": 422},
        body=lambda file_id: {
            "base": _job_spec(file_id),
            "grid": {"algorithm.mask": ["predictive", "dppo"]},
            "seeds": 1,
        },
        content=records(8),
        cancel=lambda made: [f"/v1/experiments/{made['id']}/cancel"],
    ),
    "openai": Route(
        path="/v1/fine_tuning/jobs",
        created=200,
        refused={"storage": 507, "active": 429, "budget": 400, "file": 400},
        body=lambda file_id: {
            "model": "builtin:tiny",
            "training_file": file_id,
            "method": {"type": "reinforcement", "reinforcement": {"grader": GRADER}},
            "pdppo": SMALL,
        },
        content=OPENAI_ROWS,
        cancel=lambda made: [f"/v1/fine_tuning/jobs/{made['id']}/cancel"],
    ),
}


def _arrange(
    check: str, base: Settings, route: Route, made: dict[str, Any], file_id: str
) -> tuple[Settings, list[Request]]:
    """The settings, and the requests to send first, under which `check` refuses a new create
    of `route` that `made` was the first answer of."""
    jobs = route.job_ids(made)
    if check == "storage":  # a checkpoint of the job: the tenant is past its quota now
        folder = base.artifact_dir / jobs[0] / "checkpoints"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"x" * 4096)
        update: dict[str, Any] = {"max_storage_bytes_per_tenant": 1024, "usage_cache_seconds": 0}
        return base.model_copy(update=update), []
    if check == "active":  # the tenant's active jobs are its limit now
        return base.model_copy(update={"max_active_jobs_per_tenant": len(jobs)}), []
    if check == "budget":  # a smaller model than any is the largest one a job may train now
        return base.model_copy(update={"max_params_cpu": 1, "max_params_gpu": 1}), []
    assert check == "file"  # the file deleted (the job ended first: a queued one holds it)
    ends: list[Request] = [("alice", "POST", path, {}) for path in route.cancel(made)]
    return base, [*ends, ("alice", "DELETE", f"/v1/files/{file_id}", {})]


def _create(route: Route, file_id: str, key: str) -> Request:
    headers = {"Idempotency-Key": key}
    return ("alice", "POST", route.path, {"json": route.body(file_id), "headers": headers})


ROWS = [(route, check) for route in ROUTES for check in ("storage", "active", "budget", "file")]


@pytest.mark.parametrize(("route_name", "check"), ROWS, ids=[f"{r}-{c}" for r, c in ROWS])
def test_a_retried_create_is_its_replay_whatever_would_refuse_a_new_one(
    route_name: str,
    check: str,
    settings: Settings,
) -> None:
    route = ROUTES[route_name]
    base = settings.model_copy(update={"api_publish_tasks": False})
    (stored,) = send(
        base, ("alice", "POST", "/v1/files", upload(route.content, purpose="fine-tune"))
    )
    assert stored.status_code == 201, stored.text
    file_id = stored.json()["id"]
    (first,) = send(base, _create(route, file_id, "retried"))
    assert first.status_code == route.created, first.text
    made = first.json()

    changed, before = _arrange(check, base, route, made, file_id)
    answers = send(
        changed, *before, _create(route, file_id, "fresh"), _create(route, file_id, "retried")
    )
    for done in answers[: len(before)]:
        assert done.status_code < 300, done.text
    fresh, again = answers[len(before) :]

    assert fresh.status_code == route.refused[check], fresh.text  # a new create is refused
    assert again.status_code == route.created, again.text  # the retry is the replay
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.json()["id"] == made["id"]
    assert route.job_ids(again.json()) == route.job_ids(made)
