"""How the worker records a job's end (`workers.job.runner`), one function at a time on a real
Redis.

The end-to-end paths (a real worker, a real job process) are tests/integration's; these pin what
each outcome writes and says, which those reach only for the common cases: the precedence of a
result over the reason the worker asked the job to stop, the step each message names, the hand
back that needs no reaper, and the recovery of a claim or a requeue whose reply was lost."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from typing import Any

import pytest
import redis

from pdppo.store import JobStore, StoreRetry, job_key, now_iso
from pdppo.store.keys import lease_key
from tests.support.stack import RedisServer
from tests.workers.held import RETRY, Held
from workers.job import runner
from workers.job.lease import LeaseLost
from workers.job.runner import PAUSE_REASON, SHUTDOWN_REASON, _Outcome, _Watch


def test_a_success_is_recorded_with_its_final_model(held: Held) -> None:
    result = {"outcome": "succeeded", "step": 3, "final_model": "final"}
    assert held.conclude(result) == _Outcome("succeeded at step 3")
    assert (held.field("status"), held.field("final_model")) == ("succeeded", "final")


def test_a_success_without_a_final_model_stores_none(held: Held) -> None:
    assert held.conclude({"outcome": "succeeded", "step": 3}).text == "succeeded at step 3"
    assert (held.field("status"), held.field("final_model")) == ("succeeded", None)


def test_a_result_wins_over_the_reason_the_job_was_asked_to_stop(held: Held) -> None:
    """The job finished before it saw the cancel: it succeeded, and the user is told so."""
    outcome = held.conclude({"outcome": "succeeded", "step": 4}, reason="cancel")
    assert outcome == _Outcome("succeeded at step 4")
    assert held.field("status") == "succeeded"


@pytest.mark.parametrize("trace", ["Traceback: ...", None])
def test_a_reported_failure_keeps_its_code_message_and_traceback(
    held: Held, trace: str | None
) -> None:
    result = {"outcome": "failed", "code": "bad_data", "message": "row 3 has no prompt"}
    if trace:
        result["traceback"] = trace
    assert held.conclude(result) == _Outcome("failed: bad_data")
    assert [held.field(f) for f in ("status", "error_code", "error_message")] == [
        "failed",
        "bad_data",
        "row 3 has no prompt",
    ]
    assert held.field("error_traceback") == trace
    assert held.logs()[-1] == "failed (bad_data): row 3 has no prompt"


def test_a_job_whose_record_is_gone_is_left_alone(held: Held) -> None:
    assert held.conclude({"outcome": "missing"}) == _Outcome("missing")
    assert held.field("status") == "running"


def test_a_job_deleted_while_it_stopped_is_said_to_stop_at_step_0(held: Held) -> None:
    """The record is gone (deleted by its tenant meanwhile): no step to name but the first."""
    held.client.delete(job_key("j1"))
    assert held.conclude({"outcome": "stopped", "step": 2}, "shutdown") == _Outcome(
        "stopped at step 0 for a worker shutdown", SHUTDOWN_REASON
    )


@pytest.mark.parametrize(
    ("killed", "how"), [(False, "at step 2"), (True, "killed after the grace period")]
)
def test_a_cancel_names_the_step_or_the_kill(held: Held, killed: bool, how: str) -> None:
    assert held.conclude(reason="cancel", killed=killed) == _Outcome(f"cancelled {how}")
    assert held.field("status") == "cancelled"
    assert held.logs()[-1] == f"cancelled ({how})"


def test_a_timeout_fails_the_job_naming_its_limit_and_step(held: Held) -> None:
    assert held.conclude(reason="timeout") == _Outcome("failed: timeout")
    assert held.field("error_message") == (
        "the job ran past its timeout of 1.5 minutes and was stopped at step 2; its checkpoints "
        "are kept"
    )


@pytest.mark.parametrize(
    ("reason", "outcome"),
    [
        ("shutdown", _Outcome("stopped at step 2 for a worker shutdown", SHUTDOWN_REASON)),
        ("pause", _Outcome("stopped for a pause (at step 2)", PAUSE_REASON)),
    ],
)
def test_a_shutdown_or_pause_hands_the_job_back_unwritten(
    held: Held, reason: str, outcome: _Outcome
) -> None:
    assert held.conclude(reason=reason) == outcome
    assert held.field("status") == "running"  # `run_job` hands it back, with the lease


def test_a_pause_that_ran_out_of_grace_says_the_job_was_killed(held: Held) -> None:
    """Killed, it did not stop at the step it last published: its last checkpoint is older."""
    outcome = held.conclude(reason="pause", killed=True)
    assert outcome == _Outcome("stopped for a pause (killed after the grace period)", PAUSE_REASON)


def test_a_job_stopped_by_a_redis_outage_is_handed_back_saying_so(held: Held) -> None:
    result = {"outcome": "stopped", "why": "store_unreachable", "step": 4}
    assert held.conclude(result) == _Outcome(
        "stopped at step 4: Redis unreachable",
        "Redis was unreachable from the job for over 45s; stopped at step 4 and queued again "
        "to resume from its last checkpoint",
    )
    # A shutdown asked for meanwhile is what the worker reports: it hands the job back too.
    assert held.conclude(result, reason="shutdown").hand_back == SHUTDOWN_REASON


@pytest.mark.parametrize(
    ("exitcode", "oom", "code"),
    [
        (-signal.SIGKILL, False, "killed"),
        (-signal.SIGKILL, True, "out_of_memory"),
        (1, False, "crashed"),
    ],
)
def test_a_job_that_died_without_a_result_fails_with_how_it_died(
    held: Held, exitcode: int, oom: bool, code: str
) -> None:
    assert held.conclude({}, exitcode=exitcode, oom=oom) == _Outcome(f"failed: {code}")
    assert held.field("error_code") == code


@pytest.mark.parametrize("unreachable", [True, False])
def test_a_job_process_that_lost_its_lease_is_not_written_for(
    held: Held, unreachable: bool
) -> None:
    result = {"outcome": "lease_lost", "message": "a write was refused", "unreachable": unreachable}
    with pytest.raises(LeaseLost) as lost:
        held.conclude(result)
    assert str(lost.value) == "the job process stopped: a write was refused"
    assert lost.value.unreachable is unreachable
    assert held.field("status") == "running"


def test_a_lease_lost_before_the_end_is_recorded_stops_every_write(held: Held) -> None:
    held.lease._lose("taken over", unreachable=False)
    with pytest.raises(LeaseLost):
        held.conclude({"outcome": "succeeded", "step": 3})
    assert held.field("status") == "running"


@pytest.mark.parametrize("unreachable", [True, False])
def test_after_a_lost_lease_only_an_outage_hands_the_job_back(
    held: Held, unreachable: bool
) -> None:
    """A lease lost to a live rival is the rival's job now; one that expired while Redis was
    away was nobody's: once Redis answers, this worker hands the job back saying why."""
    held.lease._lose("not renewed for 31s", unreachable=unreachable)
    lost = LeaseLost("lost", unreachable=unreachable)
    outcome = runner._after_lease_lost(held.job, held.lease, lost)
    if unreachable:
        assert outcome == _Outcome(
            "abandoned: lease expired while Redis was unreachable",
            "lease expired while Redis was unreachable (not renewed for 31s); queued again to "
            "resume from its last checkpoint",
        )
    else:
        assert outcome == _Outcome("abandoned: lease lost")


def test_a_claim_whose_reply_was_lost_is_recognised_by_the_attempt_it_counted(
    client: redis.Redis,
) -> None:
    store = JobStore(client)
    fields = {"id": "j2", "tenant": "t", "status": "queued", "queue": "cpu", "spec": "{}"}
    client.hset(job_key("j2"), mapping={**fields, "created_at": now_iso()})
    before = store.get("j2")
    assert before is not None
    assert runner._claimed(store, before) is None  # not landed: send it again
    assert store.claim("j2", "w1")
    assert runner._claimed(store, before) is True
    after = store.get("j2")
    assert after is not None
    assert runner._claimed(store, after) is None  # running, but no attempt counted since `after`


def test_a_hand_back_requeues_the_job_and_sends_its_task(
    held: Held, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, str]] = []
    monkeypatch.setattr(
        runner, "enqueue", lambda job_id, queue, priority=0: sent.append((job_id, queue))
    )
    runner._hand_back(held.store, RETRY, held.job, held.lease, "worker shutting down")
    assert held.field("status") == "queued"
    assert held.logs()[-1] == "worker shutting down"
    assert sent == [("j1", "cpu")]


def test_a_hand_back_whose_reply_was_lost_still_sends_the_task_once(
    held: Held, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, str]] = []
    monkeypatch.setattr(
        runner, "enqueue", lambda job_id, queue, priority=0: sent.append((job_id, queue))
    )
    requeue = held.store.requeue_if_orphaned
    calls: list[str] = []

    def reply_lost(*args: Any, **kwargs: Any) -> str:
        calls.append(requeue(*args, **kwargs))
        raise redis.ConnectionError("the reply was lost")

    monkeypatch.setattr(held.store, "requeue_if_orphaned", reply_lost)
    runner._hand_back(held.store, RETRY, held.job, held.lease, "worker shutting down")
    assert calls == ["requeued"]  # not sent again: the job was seen queued
    assert sent == [("j1", "cpu")]


def test_a_hand_back_whose_request_was_lost_is_sent_again(
    held: Held, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failed call never reached Redis: the job is still running, so the requeue is sent
    again rather than taken for done (which would leave the job running with nobody at it)."""
    sent: list[tuple[str, str]] = []
    monkeypatch.setattr(
        runner, "enqueue", lambda job_id, queue, priority=0: sent.append((job_id, queue))
    )
    requeue = held.store.requeue_if_orphaned
    calls: list[str] = []

    def request_lost(*args: Any, **kwargs: Any) -> str:
        if not calls:
            calls.append("lost")
            raise redis.ConnectionError("the request was lost")
        calls.append(requeue(*args, **kwargs))
        return calls[-1]

    monkeypatch.setattr(held.store, "requeue_if_orphaned", request_lost)
    runner._hand_back(held.store, RETRY, held.job, held.lease, "worker shutting down")
    assert calls == ["lost", "requeued"]
    assert held.field("status") == "queued"
    assert sent == [("j1", "cpu")]


def test_a_hand_back_with_redis_gone_is_left_to_a_reaper_by_a_worker_shutting_down(
    server: RedisServer,
    held: Held,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only a shutdown gives up: any other hand-back waits for Redis (the next test)."""
    monkeypatch.setattr(runner, "SHUTTING_DOWN", threading.Event())
    runner.SHUTTING_DOWN.set()
    server.stop()
    with caplog.at_level("ERROR", logger="workers.job.runner"):
        runner._hand_back(held.store, StoreRetry(0.5), held.job, held.lease, "shutting down")
    assert [r.getMessage() for r in caplog.records if r.name == "workers.job.runner"] == [
        "job j1: could not hand it back; a reaper will once Redis answers"
    ]


def test_a_hand_back_waits_for_redis_past_the_outage_bound(
    server: RedisServer, held: Held, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis away for longer than the store's outage bound (0.5 s here, 60 s by default): the
    hand-back lands once it answers, with its reason. It gave up instead, and a reaper then
    counted the job's worker as lost (the "mid-job stall" of earlier notes)."""
    sent: list[str] = []
    monkeypatch.setattr(runner, "enqueue", lambda job_id, queue, priority=0: sent.append(job_id))
    client = redis.Redis.from_url(server.url(), socket_timeout=0.3, decode_responses=True)
    store = JobStore(client)
    os.kill(server.proc.pid, signal.SIGSTOP)
    waker = threading.Timer(2.0, os.kill, (server.proc.pid, signal.SIGCONT))
    waker.start()
    try:
        answer = runner._hand_back(store, StoreRetry(0.5), held.job, held.lease, "why it stopped")
    finally:
        waker.join()
    assert answer == "requeued"
    assert (held.field("status"), held.field("worker_losses")) == ("queued", None)
    assert held.logs()[-1] == "why it stopped"
    assert sent == ["j1"]


def test_the_job_processes_messages_are_read_until_its_pipe_closes() -> None:
    ours, theirs = multiprocessing.Pipe()
    theirs.send({"kind": "stopping"})
    theirs.send({"kind": "progress"})
    theirs.send({"kind": "result", "outcome": "succeeded", "step": 5})
    theirs.close()
    watch = _Watch()
    runner._read(ours, watch)  # to the end, and past it without raising
    assert watch.heard is True
    assert watch.result == {"kind": "result", "outcome": "succeeded", "step": 5}


# A job stopped for a pause, handed back by its worker: what its record holds then, and for each
# branch of the requeue script, its answer, the worker's log line and the status it leaves.
OTHER_LEASE = "w2:fedcba9876543210"
HAND_BACKS = [
    ({"pause_requested": "1"}, "paused", "it waits for a resume", "paused"),
    ({}, "requeued", PAUSE_REASON, "queued"),  # a resume withdrew the pause meanwhile
    (
        {"pause_requested": "1", "cancel_requested": "1"},
        "cancelled",
        "a cancel came while it stopped",
        "cancelled",
    ),
    (
        {"status": "succeeded"},
        "not-running",
        "it was no longer running (ended, or handed back by a reaper); left as it is",
        "succeeded",
    ),
    (
        {"pause_requested": "1", "lease": OTHER_LEASE},
        "leased",
        "another worker holds its lease; left to it",
        "running",
    ),
]


@pytest.mark.parametrize(
    ("fields", "result", "said", "status"), HAND_BACKS, ids=[row[1] for row in HAND_BACKS]
)
def test_a_hand_back_after_a_pause_says_the_branch_it_took(
    held: Held,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fields: dict[str, str],
    result: str,
    said: str,
    status: str,
) -> None:
    """The pause's reason is the job's log line of the `requeued` branch only: the worker's log
    said "the pause was withdrawn ... queued again" of a job it had just parked as paused."""
    sent: list[str] = []
    monkeypatch.setattr(runner, "enqueue", lambda job_id, queue, priority=0: sent.append(job_id))
    fields = dict(fields)
    if "lease" in fields:
        held.client.set(lease_key(held.job.id), fields.pop("lease"))
    if fields:
        held.client.hset(job_key(held.job.id), mapping=fields)
    with caplog.at_level("INFO", logger="workers.job.runner"):
        handed = runner._hand_back(held.store, RETRY, held.job, held.lease, PAUSE_REASON)
    lines = [r.getMessage() for r in caplog.records if r.name == "workers.job.runner"]
    assert lines == [f"job j1: handed back ({result}): {said}"]
    assert handed == result
    assert held.field("status") == status
    assert sent == (["j1"] if result == "requeued" else [])
    outcome = _Outcome("stopped for a pause (killed after the grace period)", PAUSE_REASON)
    assert runner.ended_as(outcome, handed) == (
        f"stopped for a pause (killed after the grace period); handed back: {result}"
    )


def test_what_the_task_logs_of_a_job_not_handed_back_or_whose_hand_back_got_no_answer() -> None:
    assert runner.ended_as(_Outcome("succeeded at step 3"), None) == "succeeded at step 3"
    assert runner.ended_as(_Outcome("stopped at step 2 for a worker shutdown", "why"), None) == (
        "stopped at step 2 for a worker shutdown; handed back: not recorded (Redis unreachable)"
    )
