"""The worker's cancel watch (`workers.job.runner._CancelWatch`) keeps reading the job's cancel
flag through Redis errors: a blip must not make a later cancel go unseen until the job ends.
The store here is a stand-in for this one call (`stop_flags`), failing on cue."""

from __future__ import annotations

import time

import pytest
import redis

from workers.job.runner import CANCEL_POLL_SECONDS, _CancelWatch


class FlakyFlag:
    """Raises on the first read, answers False on the second and True from the third on."""

    def __init__(self) -> None:
        self.reads = 0

    def stop_flags(self, job_id: str) -> tuple[bool, bool]:
        assert job_id == "j1"
        self.reads += 1
        if self.reads == 1:
            raise redis.ConnectionError("Redis is restarting")
        return self.reads >= 3, False


def test_a_cancel_after_a_failed_read_is_still_seen() -> None:
    flag = FlakyFlag()
    watch = _CancelWatch(flag, "j1")  # type: ignore[arg-type]
    watch.start()
    try:
        assert watch.requested.wait(20 * CANCEL_POLL_SECONDS), f"{flag.reads} reads"
        assert flag.reads == 3
    finally:
        watch.stop()


class Reads:
    """Answers from a script, one per read (an exception is raised), then no flags."""

    def __init__(self, *answers: tuple[bool, bool] | Exception) -> None:
        self.answers = list(answers)
        self.reads = 0

    def stop_flags(self, job_id: str) -> tuple[bool, bool]:
        self.reads += 1
        answer = self.answers.pop(0) if self.answers else (False, False)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_a_run_of_failed_reads_is_logged_once_and_each_new_run_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lost = redis.ConnectionError("Connection refused")
    reads = Reads(lost, lost, (False, False), lost, (True, False))
    watch = _CancelWatch(reads, "j1")  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger="workers.job.runner"):
        watch.start()
        try:
            assert watch.requested.wait(20 * CANCEL_POLL_SECONDS)
        finally:
            watch.stop()
    warning = "could not read job j1's cancel flag (Connection refused); retrying"
    assert [r.getMessage() for r in caplog.records] == [warning, warning]


def test_the_flags_are_read_every_poll_and_not_more() -> None:
    """Twice a second: a cancel is seen within half a second, for two reads of Redis a second
    per running job. In seconds, not in CANCEL_POLL_SECONDS: a bound in its terms follows it."""
    reads = Reads()
    watch = _CancelWatch(reads, "j1")  # type: ignore[arg-type]
    watch.start()
    time.sleep(2.1)
    watch.stop()
    assert 3 <= reads.reads <= 4
