"""The worker's cancel watch (`workers.runner._CancelWatch`) keeps reading the job's cancel
flag through Redis errors: a blip must not make a later cancel go unseen until the job ends.
The store here is a stand-in for this one call (`stop_flags`), failing on cue."""

from __future__ import annotations

import redis

from workers.runner import CANCEL_POLL_SECONDS, _CancelWatch


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
