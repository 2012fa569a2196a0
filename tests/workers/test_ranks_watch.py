"""The watch over a multi-device job's ranks (`workers.job.ranks.Ranks`) on real processes and
pipes, each rank a stand-in that errs, crashes, finishes or trains on
(`tests.workers.rank_stand_ins`): a rank's error or death fails the job once, naming the rank,
and takes the other ranks down; ranks that finish fail nothing; once rank 0 is leaving, a rank's
exit is its doing. The same paths with real training: tests/integration/test_multi_device.py."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest

from core.graders.batch import GRADING_COUNTS
from tests.workers.rank_stand_ins import play
from workers.job import ranks as job_ranks
from workers.job.ranks import Failure, RankJob, Ranks


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Ranks, list[Failure]]]]:
    """`start(*acts)`: ranks 1.. of a job doing those acts, watched; killed after the test."""
    monkeypatch.setattr(job_ranks, "rank_main", play)
    made: list[tuple[Ranks, list[Failure]]] = []
    yield made
    for ranks, _ in made:
        ranks.kill()
        shutil.rmtree(ranks.job.out_dir, ignore_errors=True)


def start(made: list[tuple[Ranks, list[Failure]]], *acts: str) -> tuple[Ranks, list[Failure]]:
    plan = json.dumps({str(rank): act for rank, act in enumerate(acts, start=1)})
    out = tempfile.mkdtemp(prefix="pdppo-ranks-")
    job = RankJob(
        job_id="j1",
        config_json=plan,
        out_dir=out,
        resume=False,
        data_roots=(),
        file_paths={},
        model_dir=None,
        size=len(acts) + 1,
        port=1,
        cuda=False,
        torch_threads=1,
        log_level="INFO",
    )
    failures: list[Failure] = []
    ranks = Ranks(job, on_failure=failures.append)
    ranks.start()
    made.append((ranks, failures))
    return ranks, failures


def wait_up(ranks: Ranks) -> None:
    """Until every rank runs its act (a spawned interpreter takes seconds on a busy machine)."""
    deadline = time.monotonic() + 60
    up = [os.path.join(ranks.job.out_dir, f"rank{rank}.up") for rank in range(1, ranks.job.size)]
    while not all(os.path.exists(path) for path in up):
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.05)


def failing(made: list[tuple[Ranks, list[Failure]]], *acts: str) -> tuple[Ranks, list[Failure]]:
    """`start`, then wait for the watch to fail the job and finish (on_failure comes last)."""
    ranks, failures = start(made, *acts)
    assert ranks.failed.wait(30)
    ranks._watcher.join(10)
    return ranks, failures


def exits(ranks: Ranks) -> list[int | None]:
    return [proc.exitcode for proc in ranks.procs]


def test_a_ranks_error_fails_the_job_once_naming_the_rank_and_stops_the_others(
    started: list[tuple[Ranks, list[Failure]]], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger=job_ranks.__name__)
    ranks, failures = failing(started, "train", "error")
    # the job process's log says which job and what the rank said, not its code or traceback
    assert [r.getMessage() for r in caplog.records] == [
        "job j1: rank 2 of 3: ValueError: rank 2 has bad data"
    ]
    assert failures == [
        (
            "invalid_input",
            "rank 2 of 3: ValueError: rank 2 has bad data",
            "Traceback (most recent call last): ...",
        )
    ]  # once: the erring rank's exit (status 1) after it is not a second failure
    assert exits(ranks)[0] == -signal.SIGKILL
    assert exits(ranks)[1] in (1, -signal.SIGKILL)  # its own exit, or the kill that beat it


def test_a_rank_that_dies_without_a_word_fails_the_job_with_how_it_died(
    started: list[tuple[Ranks, list[Failure]]],
) -> None:
    ranks, failures = failing(started, "crash", "train")
    assert failures == [
        (
            "training_error",
            "rank 1 of 3 exited with code 3 without a result; the job's other ranks were stopped",
            "",
        )
    ]
    assert exits(ranks) == [3, -signal.SIGKILL]


def test_ranks_that_finish_fail_nothing_and_the_watch_ends(
    started: list[tuple[Ranks, list[Failure]]],
) -> None:
    ranks, failures = start(started, "finish", "finish")
    wait_up(ranks)  # a spawned interpreter's start is no part of the bound below
    ranks._watcher.join(30)
    assert not ranks._watcher.is_alive()
    assert (failures, ranks.failed.is_set(), exits(ranks)) == ([], False, [0, 0])
    assert ranks.close(failing=False) is True


def test_the_grading_counts_ranks_send_are_added_to_the_job_processes_and_fail_nothing(
    started: list[tuple[Ranks, list[Failure]]],
) -> None:
    """Each rank grades its share: the service's counters count what every rank graded, not
    rank 0's alone (`RankCallback`); its messages are not taken for its error."""
    GRADING_COUNTS.take()
    ranks, failures = start(started, "grade", "grade")
    wait_up(ranks)
    ranks.join(30)  # once the ranks have left, the watch has read all they sent
    assert not ranks._watcher.is_alive()
    assert (failures, ranks.failed.is_set(), exits(ranks)) == ([], False, [0, 0])
    assert GRADING_COUNTS.take() == {"completions": 32, "errors": 12, "timeouts": 4}


def test_once_rank_0_is_leaving_a_ranks_death_is_its_doing(
    started: list[tuple[Ranks, list[Failure]]],
) -> None:
    """Rank 0 closes the watch before it stops the others itself: their deaths then fail
    nothing, and kill nothing more."""
    ranks, failures = start(started, "train", "train")
    assert ranks.close(failing=False) is True
    ranks.procs[0].kill()
    ranks.procs[0].join(10)
    time.sleep(1.0)  # the watch has seen the death by now
    assert (failures, ranks.failed.is_set()) == ([], False)
    assert exits(ranks) == [-signal.SIGKILL, None]  # rank 2 is rank 0's to stop


def test_rank_0_leaving_with_an_error_waits_for_the_watch_to_name_a_dead_rank(
    started: list[tuple[Ranks, list[Failure]]],
) -> None:
    """Rank 0's error is the echo of rank 1's death, which the watch sees a moment later: the
    job's error is the death's, and rank 0 does not wait out the whole grace for it."""
    ranks, failures = start(started, "train", "train")
    wait_up(ranks)
    killer = threading.Timer(0.3, os.kill, (ranks.procs[0].pid, signal.SIGKILL))
    asked = time.monotonic()
    killer.start()
    assert ranks.close(failing=True) is False
    assert time.monotonic() - asked < job_ranks.PEER_GRACE_S
    ranks._watcher.join(10)  # on_failure comes after the watch killed the others
    assert [message for _, message, _ in failures] == [
        "rank 1 of 3 was killed by SIGKILL (the kernel's OOM killer sends SIGKILL when memory "
        "runs out); the job's other ranks were stopped"
    ]


def test_rank_0_leaving_with_an_error_of_its_own_waits_the_grace_then_leaves(
    started: list[tuple[Ranks, list[Failure]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job_ranks, "PEER_GRACE_S", 0.5)
    ranks, failures = start(started, "train", "train")
    asked = time.monotonic()
    assert ranks.close(failing=True) is True
    assert time.monotonic() - asked >= 0.5
    assert failures == []


def test_joining_gives_leaving_ranks_the_time_and_kills_the_rest(
    started: list[tuple[Ranks, list[Failure]]],
) -> None:
    began = time.monotonic()
    ranks, failures = start(started, "finish", "train")
    wait_up(ranks)  # rank 1 leaves a second from now: join waits for it
    # Rank 1 has its second to sleep and then an interpreter to end, which on a busy machine
    # (a parallel test run) takes longer than the second: the join's time is measured from how
    # long these ranks took to start here, never below 2 s. A join that does not wait kills
    # rank 1 (-SIGKILL, not 0); one that waits for no timeout leaves rank 2 running (None).
    timeout = max(2.0, 1.0 + (time.monotonic() - began))
    ranks.close(failing=False)
    asked = time.monotonic()
    ranks.join(timeout)
    assert timeout <= time.monotonic() - asked < timeout + 15
    assert exits(ranks) == [0, -signal.SIGKILL]
    assert failures == []


def test_a_rank_the_watch_reaps_while_rank_0_kills_it_still_has_its_exit(
    started: list[tuple[Ranks, list[Failure]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watch and rank 0 both wait for a killed rank; with two waitpid calls on one process,
    CPython's Popen.poll gives the loser no exit code (ECHILD reads as "still running"). Here the
    watch reaps first and is slow to record it, as a busy machine makes it (a CI run saw
    [0, None] in the test above): rank 0 must still read -SIGKILL."""
    ranks, _ = start(started, "train")
    wait_up(ranks)
    real_waitpid = os.waitpid

    def waitpid(pid: int, flags: int) -> tuple[int, int]:
        if threading.current_thread() is not ranks._watcher:
            time.sleep(0.2)  # the watch gets there first
        got = real_waitpid(pid, flags)
        if threading.current_thread() is ranks._watcher and got[0] == pid:
            time.sleep(1.0)  # ...and records it late
        return got

    monkeypatch.setattr(os, "waitpid", waitpid)
    ranks.close(failing=False)
    ranks.kill()
    assert exits(ranks) == [-signal.SIGKILL]


def test_killing_running_ranks_does_not_wait_for_them_first(
    started: list[tuple[Ranks, list[Failure]]],
) -> None:
    """kill() only looks whether a rank has ended (a wait of 0) before it sends SIGKILL: rank 0
    leaving mid-run, or the watch failing the job, must not give each rank time to leave."""
    ranks, failures = start(started, "train", "train")
    wait_up(ranks)
    ranks.close(failing=False)
    asked = time.monotonic()
    ranks.kill()
    assert time.monotonic() - asked < 1.0
    assert exits(ranks) == [-signal.SIGKILL, -signal.SIGKILL]
    assert failures == []
