"""Routes in-process (the real app over ASGI, a real redis-server), with their known answers:
liveness and readiness, and how the results routes pick JSON or CSV from `Accept`. Faster than
a started server, so the mutation run of `api/routes` (bench/mutation.toml, group "routes")
can afford them."""

from __future__ import annotations

import pytest

from api.routes.results import _format_from
from pdppo.settings import Settings
from tests.api.test_upload_route import call, redis_url, settings  # noqa: F401


@pytest.mark.parametrize(
    ("accept", "chosen"),
    [
        (None, "json"),
        ("", "json"),
        ("*/*", "json"),
        ("text/csv", "csv"),
        ("TEXT/CSV; q=0.9", "csv"),
        ("text/html, text/csv;q=0.5", "csv"),
        ("text/csv, application/json", "json"),  # asked for both: JSON
        ("application/json", "json"),
    ],
)
def test_results_answer_csv_only_when_asked_for_it_alone(accept: str | None, chosen: str) -> None:
    assert _format_from(accept) == chosen


def test_liveness_and_readiness(settings: Settings) -> None:  # noqa: F811
    healthy, ready = call(settings, ("alice", "/healthz", {}), ("alice", "/readyz", {}))
    assert (healthy.status_code, healthy.json()) == (200, {"status": "ok", "detail": None})
    assert (ready.status_code, ready.json()) == (200, {"status": "ok", "detail": None})
    low = settings.model_copy(update={"min_free_bytes": 1 << 62})  # no disk keeps that free
    (short,) = call(low, ("alice", "/readyz", {}))
    assert short.status_code == 200  # a low disk is reported, not unready
    assert short.json()["status"] == "ok"
    assert short.json()["detail"].startswith("disk: low (")


def test_why_a_job_has_no_final_model() -> None:
    from api.routes.artifacts import _has_final_model, _no_final_model
    from tests.api.test_checkpoint_listing import job

    said = {s: _no_final_model(job(s)) for s in ("succeeded", "queued", "paused", "failed")}
    assert said == {
        "succeeded": "job 'j1' has no final model in the artifact store",
        "queued": "job 'j1' has no final model yet (it is queued)",
        "paused": "job 'j1' has no final model yet (it is paused)",
        "failed": "job 'j1' has no final model (it is failed; only a succeeded job has one)",
    }
    assert [_has_final_model(job(s)) for s in ("succeeded", "running", "cancelled")] == [
        True,
        False,
        False,
    ]
