"""Which phase reports a job publishes (`workers.job.events.phase_due`): every change and each
phase's first and last report, progress in between at most every second and every 1%."""

from __future__ import annotations

import pytest

from workers.job.events import PHASE_EVERY_SECONDS, phase_due

LATER = PHASE_EVERY_SECONDS  # seconds since the last published report: just due
SOON = PHASE_EVERY_SECONDS / 2


@pytest.mark.parametrize(
    ("last", "elapsed", "report", "due"),
    [
        (None, 0.0, ("loading model", None, None), True),  # the first report of a run
        (("loading model", None), 0.0, ("warm-up", 0, 65), True),  # a new phase, at once
        (
            (
                "warm-up",
                0,
            ),
            SOON,
            ("warm-up", 1, 65),
            False,
        ),  # too soon
        (("warm-up", 0), LATER, ("warm-up", 1, 65), True),  # 1.5% later, a second on
        (("warm-up", 0), LATER, ("warm-up", 5, 1000), False),  # a second on, 0.5% later
        (("warm-up", 0), LATER, ("warm-up", 10, 1000), True),  # 1% later
        (("warm-up", 3), 0.0, ("warm-up", 65, 65), True),  # the last: at once
        (("warm-up", 65), 0.0, ("training", 0, 40), True),
        (("training", 0), 0.0, ("training", 0, 40), False),  # (trainer repeats nothing, but)
        (("training", None), 0.0, ("evaluating", None, None), True),
        (("saving", None), 0.0, ("saving", None, None), True),  # no progress to throttle
    ],
)
def test_phase_reports_published(
    last: tuple[str, int | None] | None,
    elapsed: float,
    report: tuple[str, int | None, int | None],
    due: bool,
) -> None:
    assert phase_due(last, elapsed, *report) is due
