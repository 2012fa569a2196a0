"""The stop protocol (`core.training.callbacks.Stop`) as a table: a caller that requests a stop
or not, whose stop keeps work or not, in one process or among ranks, against each place the run
asks (a step boundary, a generated token, between minibatch updates). Whole runs that stop at
each place: tests/core/test_stop_keeps_work.py and test_trainer_resume.py."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from core.parallel.distributed import World
from core.training.callbacks import Stop, TrainerCallback


class Caller(TrainerCallback):
    def __init__(self, requested: bool, keeps_work: bool) -> None:
        self.requested, self.keeps_work = requested, keeps_work
        self.asked = 0

    def should_stop(self) -> bool:
        self.asked += 1
        return self.requested

    def stop_keeps_work(self) -> bool:
        return self.keeps_work


@dataclass(frozen=True)
class TwoRanks(World):
    """Two ranks where the other one says no: `agree` is the max of the two answers, as the
    collective would return it."""

    def max(self, value: float) -> float:
        return max(value, 0.0)


ONE, RANKS = World(), TwoRanks(rank=0, size=2)

# requested, keeps work, world -> (at a boundary, at a token, between minibatches: stop now?,
# heard after it)
ROWS = [
    (False, True, ONE, (False, False, False, False)),
    (False, False, ONE, (False, False, False, False)),
    (True, True, ONE, (True, True, False, True)),  # a pause: the step finishes
    (True, False, ONE, (True, True, True, False)),  # a cancel: the update stops at once
    (False, True, RANKS, (False, False, False, False)),
    (True, True, RANKS, (True, False, False, False)),  # ranks stop at the boundary only
    (True, False, RANKS, (True, False, False, False)),
]


@pytest.mark.parametrize(("requested", "keeps_work", "world", "want"), ROWS)
def test_where_a_stop_is_acted_on(
    requested: bool, keeps_work: bool, world: World, want: tuple[bool, bool, bool, bool]
) -> None:
    caller = Caller(requested, keeps_work)
    stop = Stop(caller, world)
    got = (stop.at_boundary(), stop.in_step(), stop.between_minibatches(), stop.heard)
    assert got == want
    assert caller.asked == 3  # asked everywhere, among ranks too: a worker hears it at once


def test_a_heard_stop_ends_the_run_at_the_next_boundary_though_no_longer_requested() -> None:
    caller = Caller(requested=True, keeps_work=True)
    stop = Stop(caller, ONE)
    assert stop.between_minibatches() is False and stop.heard
    caller.requested = False  # a caller that says it once
    assert stop.at_boundary() is True


def test_the_partial_update_is_marked_from_the_first_optimizer_step() -> None:
    stop = Stop(Caller(requested=False, keeps_work=True), ONE)
    assert stop.partial is False
    stop.update_begins()
    assert stop.partial is True
