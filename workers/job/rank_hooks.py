"""What a rank of a multi-device job does at its step boundaries (`workers.job.ranks`): it tells
the job process what it graded, and follows the job's share of the host's cores.

Each rank grades its own share of every step, and only the job process writes to the service,
so the counts go over the rank's pipe, which the job process's watch reads (the service's
counters then count every rank's, not rank 0's alone). The trainer's modules load here, in the
rank, which runs the trainer; `workers.job.ranks`, which the job process imports to watch the
ranks, stays without them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core.graders.batch import GRADING_COUNTS
from core.training.callbacks import TrainerCallback
from workers.job.cores import follow_share


class RankCallback(TrainerCallback):
    """Rank k's callback: after each step, its grading counts to the job process (`report`: over
    the rank's pipe; the job process counts them for the service, `workers.job.events`), and at
    each step boundary the job's share of the cores (`threads`, shared with the job process;
    None: the share it started with)."""

    def __init__(self, report: Callable[[dict[str, int]], None], threads: Any = None) -> None:
        self.report = report
        self.threads = threads

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        if self.threads is not None:
            follow_share(self.threads)
        counts = GRADING_COUNTS.take()
        if any(counts.values()):
            self.report(counts)

    def on_phase(self, name: str, done: int | None = None, total: int | None = None) -> None:
        if self.threads is not None:
            follow_share(self.threads)
