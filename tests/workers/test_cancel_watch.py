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
    watch = _CancelWatch(flag, "j1", "w1:token")  # type: ignore[arg-type]
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
    watch = _CancelWatch(reads, "j1", "w1:token")  # type: ignore[arg-type]
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
    watch = _CancelWatch(reads, "j1", "w1:token")  # type: ignore[arg-type]
    watch.start()
    time.sleep(2.1)
    watch.stop()
    assert 3 <= reads.reads <= 4


class Pausing(Reads):
    """A pause asked on every read; `begin_pause` answers `carried` (False: it was withdrawn
    between the read and the store's mark, or a cancel came)."""

    def __init__(self, carried: bool) -> None:
        super().__init__()
        self.carried = carried
        self.marks: list[tuple[str, str]] = []

    def stop_flags(self, job_id: str) -> tuple[bool, bool]:
        self.reads += 1
        return False, True

    def begin_pause(self, job_id: str, *, lease_token: str) -> bool:
        self.marks.append((job_id, lease_token))
        return self.carried


@pytest.mark.parametrize("carried", [True, False])
def test_a_pause_is_carried_out_only_once_the_store_has_marked_it(carried: bool) -> None:
    """The store's mark decides (`JobStore.begin_pause`), so that a resume says truly whether
    the job runs on or stops anyway: a pause withdrawn in between is not carried out."""
    store = Pausing(carried)
    watch = _CancelWatch(store, "j1", "w1:token")  # type: ignore[arg-type]
    watch.start()
    try:
        deadline = time.monotonic() + 20 * CANCEL_POLL_SECONDS
        while store.reads < 3:
            assert time.monotonic() < deadline, store.reads
            time.sleep(0.05)
    finally:
        watch.stop()
    assert watch.pause.is_set() is carried
    # marked once; asked again at every read while it is not
    assert store.marks[0] == ("j1", "w1:token")
    assert (len(store.marks) == 1) is carried
