"""The Celery settings the training worker's guarantees rest on, read from the app as it ships.

A change to any of them passes every other test on Celery 5 and breaks a promise later: Celery
6 flips `worker_cancel_long_running_tasks_on_connection_loss` to True, which would cancel a
running job on a Redis blip that the runner is built to ride out."""

from __future__ import annotations

import pytest

from pdppo.settings import get_settings
from workers.celery_app import celery_app, make_celery, side_app


def test_a_redis_blip_never_cancels_the_running_job() -> None:
    assert celery_app.conf.worker_cancel_long_running_tasks_on_connection_loss is False


def test_a_task_is_acknowledged_after_it_ran_and_redelivered_if_its_worker_is_lost() -> None:
    assert celery_app.conf.task_acks_late is True
    assert celery_app.conf.task_reject_on_worker_lost is True
    assert celery_app.conf.worker_prefetch_multiplier == 1


def test_every_broker_call_waits_for_redis_no_longer_than_the_store_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a socket timeout, a worker told to stop while Redis was stalled waited in its
    shutdown for as long as the stall lasted (tests/integration/test_worker_stop_redis_down.py)."""
    monkeypatch.setenv("PDPPO_REDIS_SOCKET_TIMEOUT_SECONDS", "3.5")
    monkeypatch.setenv("PDPPO_REDIS_CONNECT_TIMEOUT_SECONDS", "1.5")
    monkeypatch.setenv("PDPPO_VISIBILITY_TIMEOUT_SECONDS", "7200")
    get_settings.cache_clear()
    try:
        training = make_celery().conf.broker_transport_options
        side = side_app("side", "side").conf.broker_transport_options
    finally:
        get_settings.cache_clear()
    assert training == {
        "visibility_timeout": 7200,
        "socket_timeout": 3.5,
        "socket_connect_timeout": 1.5,
    }
    assert side == {"socket_timeout": 3.5, "socket_connect_timeout": 1.5}
