"""A job's routes in-process (the real app over ASGI, a real redis-server), each with its known
answers: the event stream of an ended job, a cancel and the task it revokes, a model asked of a
job that has none, an Idempotency-Key whose job was deleted, deleting, resuming past the active
limit, and changes that lose every race or name a setting that cannot change. Fast enough for
the quick tests of the mutation group "routes" (bench/mutation.toml)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis

import api.jobs.revoke
from pdppo.settings import Settings
from pdppo.store.jobs.steering import AsyncSteering
from pdppo.store.keys import events_key, job_key, tenant_active_key
from tests.support.inprocess import send
from tests.support.seed import seed_job
from tests.support.specs import smoke_spec


def _client(settings: Settings) -> redis.Redis:
    return redis.Redis.from_url(settings.redis_url, decode_responses=True)


def test_an_ended_jobs_stream_sends_its_events_then_ends(settings: Settings) -> None:
    """The whole stream, to its `done`, and the response ends cleanly (the app raises nothing:
    the transport would re-raise it here)."""
    client = _client(settings)
    seed_job(client, "j-ended", "succeeded", tenant="alice")
    status = json.dumps({"status": "succeeded", "at": "2026-12-05T00:00:00+00:00"})
    done = json.dumps({"status": "succeeded"})
    first = client.xadd(events_key("j-ended"), {"type": "status", "data": status}, id="1-1")
    last = client.xadd(events_key("j-ended"), {"type": "done", "data": done}, id="2-1")
    whole, after_first, bobs = send(
        settings,
        ("alice", "GET", "/v1/jobs/j-ended/events", {}),
        ("alice", "GET", "/v1/jobs/j-ended/events", {"headers": {"Last-Event-ID": first}}),
        ("bob", "GET", "/v1/jobs/j-ended/events", {}),
    )
    assert (first, last) == ("1-1", "2-1")
    assert whole.status_code == 200
    assert whole.headers["content-type"].startswith("text/event-stream")
    status_frame = f"id: 1-1\r\nevent: status\r\ndata: {status}\r\n\r\n"
    done_frame = f"id: 2-1\r\nevent: done\r\ndata: {done}\r\n\r\n"
    assert whole.text == status_frame + done_frame
    assert after_first.text == done_frame
    assert bobs.status_code == 404


def test_a_cancel_revokes_the_task_of_a_job_not_running_only(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A queued or paused job is cancelled at once and its task revoked (best effort: a revoke
    that fails is logged and the cancel stands); a running one is asked to stop, and its task,
    already running, is left alone. The broker's broadcast is recorded, not sent: no worker
    listens here."""
    revoked: list[str] = []

    def revoke(job_id: str) -> None:
        revoked.append(job_id)
        if job_id == "j-paused":
            raise ConnectionError("the broker is down")

    monkeypatch.setattr(api.jobs.revoke, "revoke_queued", revoke)
    client = _client(settings)
    for job_id, status in (
        ("j-queued", "queued"),
        ("j-paused", "paused"),
        ("j-running", "running"),
    ):
        seed_job(client, job_id, status, tenant="alice")
    seed_job(client, "j-done", "failed", tenant="alice")
    queued, paused, running, done, bobs = send(
        settings,
        ("alice", "POST", "/v1/jobs/j-queued/cancel", {}),
        ("alice", "POST", "/v1/jobs/j-paused/cancel", {}),
        ("alice", "POST", "/v1/jobs/j-running/cancel", {}),
        ("alice", "POST", "/v1/jobs/j-done/cancel", {}),
        ("bob", "POST", "/v1/jobs/j-running/cancel", {}),
    )
    assert revoked == ["j-queued", "j-paused"]
    assert [(a.status_code, a.json()["status"]) for a in (queued, paused)] == [
        (202, "cancelled"),
        (202, "cancelled"),
    ]
    assert (running.status_code, running.json()["status"]) == (202, "running")
    assert running.json()["cancel_requested"] is True
    assert (done.status_code, done.json()) == (
        409,
        {"detail": "job 'j-done' already failed; nothing to cancel"},
    )
    assert bobs.status_code == 404


def test_a_model_asked_of_a_job_without_one_is_404_saying_why(
    settings: Settings,
) -> None:
    client = _client(settings)
    seed_job(client, "j-running", "running", tenant="alice")
    seed_job(client, "j-kept", "succeeded", tenant="alice")  # its folder is gone
    running, kept, bobs = send(
        settings,
        ("alice", "GET", "/v1/jobs/j-running/model", {}),
        ("alice", "GET", "/v1/jobs/j-kept/model", {}),
        ("bob", "GET", "/v1/jobs/j-kept/model", {}),
    )
    assert (running.status_code, running.json()) == (
        404,
        {"detail": "job 'j-running' has no final model yet (it is running)"},
    )
    assert (kept.status_code, kept.json()) == (
        404,
        {"detail": "job 'j-kept' has no final model in the artifact store"},
    )
    assert bobs.status_code == 404


def test_a_retry_whose_job_was_deleted_is_404_naming_it(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Idempotency-Key outlives the job it made: a retry after the job was deleted finds
    the key, not the job, and says so rather than making a second job for the same key. (The
    cancel's revoke is recorded: the Celery app's broker is the environment's Redis, not this
    test's.)"""
    revoked: list[str] = []
    monkeypatch.setattr(api.jobs.revoke, "revoke_queued", revoked.append)
    settings = settings.model_copy(update={"api_publish_tasks": False})
    same = {"json": smoke_spec(), "headers": {"Idempotency-Key": "retry-2"}}
    (made,) = send(settings, ("alice", "POST", "/v1/jobs", dict(same)))
    job_id = made.json()["id"]
    cancelled, deleted, retry = send(
        settings,
        ("alice", "POST", f"/v1/jobs/{job_id}/cancel", {}),
        ("alice", "DELETE", f"/v1/jobs/{job_id}", {}),
        ("alice", "POST", "/v1/jobs", dict(same)),
    )
    assert (made.status_code, cancelled.status_code, deleted.status_code) == (201, 202, 204)
    assert (retry.status_code, retry.json()) == (404, {"detail": f"job {job_id!r} not found"})
    assert not _client(settings).exists(job_key(job_id))
    assert revoked == [job_id]


def test_deleting_answers_by_the_jobs_state(settings: Settings) -> None:
    """Only an ended job is deleted; one whose worker still holds it is 409 with Retry-After,
    one that has not ended is 409 naming the cancel; another tenant's is 404."""
    held_id, active_id, ended_id = (f"{n:024x}" for n in (1, 2, 3))  # new_job_id's form
    client = _client(settings)
    seed_job(client, held_id, "succeeded", tenant="alice", lease_token="w-1")
    seed_job(client, active_id, "running", tenant="alice")
    seed_job(client, ended_id, "failed", tenant="alice")
    held, active, bobs, ended, gone = send(
        settings,
        ("alice", "DELETE", f"/v1/jobs/{held_id}", {}),
        ("alice", "DELETE", f"/v1/jobs/{active_id}", {}),
        ("bob", "DELETE", f"/v1/jobs/{ended_id}", {}),
        ("alice", "DELETE", f"/v1/jobs/{ended_id}", {}),
        ("alice", "GET", f"/v1/jobs/{ended_id}", {}),
    )
    assert (held.status_code, held.json(), held.headers.get("Retry-After")) == (
        409,
        {"detail": f"job {held_id!r} has ended but its worker is still finishing it; try again"},
        "5",
    )
    assert (active.status_code, active.json()) == (
        409,
        {
            "detail": f"job {active_id!r} is running; only an ended job can be deleted: cancel "
            f"it first (pdppo cancel {active_id})"
        },
    )
    assert "Retry-After" not in active.headers
    assert (bobs.status_code, ended.status_code, gone.status_code) == (404, 204, 404)
    assert client.exists(job_key(held_id), job_key(active_id)) == 2


def test_a_job_failed_for_its_disk_resumes_only_under_the_active_limit(
    settings: Settings,
) -> None:
    """Resuming a job that failed for its disk makes it active again: refused (429) while the
    tenant has PDPPO_MAX_ACTIVE_JOBS_PER_TENANT active jobs, which a paused one does not add to
    (it is one of them already)."""
    settings = settings.model_copy(
        update={"max_active_jobs_per_tenant": 2, "api_publish_tasks": False}
    )
    client = _client(settings)
    seed_job(client, "j-run", "running", tenant="alice")
    seed_job(client, "j-paused", "paused", tenant="alice")
    seed_job(client, "j-disk", "failed", tenant="alice", error_code="storage_full")
    full, paused, still_full = send(
        settings,
        ("alice", "POST", "/v1/jobs/j-disk/resume", {}),
        ("alice", "POST", "/v1/jobs/j-paused/resume", {}),
        ("alice", "POST", "/v1/jobs/j-disk/resume", {}),
    )
    limit = (
        429,
        {
            "detail": "tenant 'alice' has 2 queued, running or paused jobs "
            "(PDPPO_MAX_ACTIVE_JOBS_PER_TENANT): resume this one once one of them ends"
        },
    )
    assert (full.status_code, full.json()) == limit
    assert (paused.status_code, paused.json()["status"]) == (202, "queued")
    assert (still_full.status_code, still_full.json()) == limit
    client.srem(tenant_active_key("alice"), "j-run")  # as its end would
    (resumed,) = send(settings, ("alice", "POST", "/v1/jobs/j-disk/resume", {}))
    assert (resumed.status_code, resumed.json()["status"]) == (202, "queued")


def test_a_change_that_loses_every_race_is_409_after_five_tries(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another client's change lands before each of ours (its version bumped in the store, as
    its own patch would): the route computes the change again over it, and after
    CONFLICT_RETRIES tries gives up with a 409 to retry."""
    client = _client(settings)
    seed_job(client, "j-busy", "running", tenant="alice", spec=json.dumps(smoke_spec()))
    real = AsyncSteering.patch
    tries: list[int] = []

    async def patch_after_another(
        self: AsyncSteering, job_id: str, base: int, *args: Any, **kwargs: Any
    ) -> Any:
        tries.append(base)
        client.hincrby(job_key(job_id), "config_version", 1)  # the other client's change
        return await real(self, job_id, base, *args, **kwargs)

    monkeypatch.setattr(AsyncSteering, "patch", patch_after_another)
    headers = {"Content-Type": "application/merge-patch+json"}
    change = {"json": {"train": {"optim": {"lr": 0.001}}}, "headers": headers}
    (lost,) = send(settings, ("alice", "PATCH", "/v1/jobs/j-busy", change))
    assert (lost.status_code, lost.json()) == (
        409,
        {"detail": "job 'j-busy' is being changed by another client; retry"},
    )
    assert tries == [0, 1, 2, 3, 4]
    assert client.hget(job_key("j-busy"), "overrides") is None  # none of ours landed


def test_a_change_to_a_setting_that_cannot_change_while_running_is_422_naming_it(
    settings: Settings,
) -> None:
    client = _client(settings)
    seed_job(client, "j-fixed", "running", tenant="alice", spec=json.dumps(smoke_spec()))
    headers = {"Content-Type": "application/merge-patch+json"}
    (refused,) = send(
        settings,
        (
            "alice",
            "PATCH",
            "/v1/jobs/j-fixed",
            {"json": {"train": {"seed": 7}}, "headers": headers},
        ),
    )
    assert refused.status_code == 422
    assert refused.json()["errors"] == [
        {
            "loc": ["body", "train", "seed"],
            "msg": "cannot change while a job runs; these can: optim.lr, algorithm.mask, "
            "algorithm.delta_low, algorithm.delta_high, algorithm.is_cap, "
            "algorithm.correction.cap, algorithm.correction.low, algorithm.correction.high, "
            "algorithm.correction.eps_low, algorithm.correction.eps_high, algorithm.kl_beta, "
            "rollout.temperature, steps",
            "type": "value_error.steering",
        }
    ]
    assert client.hget(job_key("j-fixed"), "config_version") is None  # nothing changed


def test_a_change_to_a_queued_job_keeps_its_age_in_the_queue(
    settings: Settings,
) -> None:
    """`pdppo_queue_oldest_job_age_seconds` is how long the job has waited since it was queued:
    a PATCH while it waits changes its settings, not its wait. Before, the age was read from
    `updated_at`, which the PATCH moves: right after it the job read as queued for 0 s."""
    headers = {"Content-Type": "application/merge-patch+json"}
    change = {"json": {"train": {"optim": {"lr": 0.001}}}, "headers": headers}
    quiet = settings.model_copy(update={"api_publish_tasks": False})
    (made,) = send(quiet, ("alice", "POST", "/v1/jobs", {"json": smoke_spec()}))
    assert made.status_code == 201, made.text
    time.sleep(2.0)
    patched, metrics = send(
        quiet,
        ("alice", "PATCH", f"/v1/jobs/{made.json()['id']}", change),
        ("alice", "GET", "/metrics", {}),
    )
    assert patched.status_code == 200, patched.text
    assert patched.json()["config_version"] == 1
    ages = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.text.splitlines()
        if line.startswith('pdppo_queue_oldest_job_age_seconds{queue="cpu"}')
    ]
    assert len(ages) == 1
    assert 2.0 <= ages[0] < 30.0, ages


def test_a_change_with_if_match_is_made_only_over_the_version_it_names(
    settings: Settings,
) -> None:
    """`If-Match` carries the `config_version` a change was computed from (the job's `ETag`):
    a change over another version is 412 with the version the job is at, and changes nothing;
    `*` and no If-Match change whatever version the job is at. A weak tag or anything that is
    no version never matches (RFC 9110's strong comparison)."""
    client = _client(settings)
    seed_job(client, "j-v", "running", tenant="alice", spec=json.dumps(smoke_spec()))

    def change(lr: float, if_match: str | None) -> tuple[str, str, dict[str, Any]]:
        headers = {"Content-Type": "application/merge-patch+json"}
        if if_match is not None:
            headers["If-Match"] = if_match
        body = {"train": {"optim": {"lr": lr}}}
        return ("alice", "PATCH", "/v1/jobs/j-v", {"json": body, "headers": headers})

    read = ("alice", "GET", "/v1/jobs/j-v", {})
    answers = send(
        settings,
        read,
        change(0.1, '"0"'),
        change(0.2, '"0"'),  # computed from version 0, which is gone
        change(0.3, '"7", "1"'),
        change(0.4, "*"),
        change(0.5, 'W/"3"'),
        change(0.6, "3"),  # not an entity tag
        change(0.7, None),
        read,
    )
    seen = [(a.status_code, a.headers.get("ETag")) for a in answers]
    assert seen == [
        (200, '"0"'),
        (200, '"1"'),
        (412, '"1"'),
        (200, '"2"'),
        (200, '"3"'),
        (412, '"3"'),
        (412, '"3"'),
        (200, '"4"'),
        (200, '"4"'),
    ]
    stale = (
        "job 'j-v' is at config_version {v}, not {asked}: it was changed since; read it again "
        "(its ETag) and compute the change over that"
    )
    assert answers[2].json() == {
        "detail": stale.format(v=1, asked='"0"'),
        "config_version": 1,
    }
    assert answers[5].json()["detail"] == stale.format(v=3, asked='W/"3"')
    assert answers[6].json()["detail"] == stale.format(v=3, asked="3")
    assert answers[-1].json()["overrides"] == {"train": {"optim": {"lr": 0.7}}}
    assert client.hget(job_key("j-v"), "config_version") == "4"
