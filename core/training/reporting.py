"""The run's reports to experiment trackers (`train.report_to`, `core.tracking`), in one place
that `pdppo train` and a service job both go through: `core.training.trainer.train` wraps its
caller's callback in `ReportingCallback`, which passes every hook on unchanged and hands each
step, evaluation, sample table, steering change and checkpoint to the `Reporter` (a queue per
tracker: nothing here waits on a tracker). At step boundaries it tells the caller the tracker
runs opened (`on_trackers`) and, in the run's log, the reports dropped while a tracker was
away."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.config import TrainConfig
from core.tracking import Reporter, TrackingOptions
from core.tracking.base import require_trackers
from core.training.callbacks import TrainerCallback
from core.training.evaluation import Sample


def tracking_for(config: TrainConfig, tracking: TrackingOptions | None) -> TrackingOptions | None:
    """What the run reports to: the trackers its config names and the operator's
    (`tracking.report_to`, `PDPPO_REPORT_TO`), each once; None for none. Raises `MissingExtra`
    when one's library is not installed (before any model is loaded)."""
    base = tracking if tracking is not None else TrackingOptions()
    names = tuple(dict.fromkeys([*config.report_to, *base.report_to]))
    if not names:
        return None
    require_trackers(names)
    return TrackingOptions(**{**base.__dict__, "report_to": names})


class ReportingCallback(TrainerCallback):
    """`inner`'s hooks, and the same progress reported to the trackers once `attach`ed."""

    def __init__(self, inner: TrainerCallback) -> None:
        self.inner = inner
        self.reporter: Reporter | None = None
        # asked before every generated token: the caller's own, without a frame in between
        self.should_stop = inner.should_stop  # type: ignore[method-assign]
        self.stop_keeps_work = inner.stop_keeps_work  # type: ignore[method-assign]
        self.config_update = inner.config_update  # type: ignore[method-assign]

    def attach(self, reporter: Reporter, config: TrainConfig, resumed: Path | None) -> None:
        """Start reporting; `resumed`: the folder of a resumed run, whose steps up to its
        checkpoint are reported again from its files (the trackers skip those they took)."""
        self.reporter = reporter
        reporter.start()
        reporter.config(config.model_dump(mode="json"))
        if resumed is not None:
            backfill(reporter, resumed)

    def close(self) -> None:
        """The trackers' last reports, waited for a bounded time; what was lost, in the log."""
        if self.reporter is None:
            return
        lines = self.reporter.close()
        self._tell()
        for line in lines:
            self.inner.on_log(line)
        self.reporter = None

    def _tell(self) -> None:
        if self.reporter is None:
            return
        runs = self.reporter.new_runs()
        if runs:
            for name, run in runs.items():
                where = run.get("url") or run["run_id"]
                self.inner.on_log(f"reporting to {name}: {where}")
            self.inner.on_trackers(runs)
        for line in self.reporter.notes():
            self.inner.on_log(line)

    def on_step(self, step: int, metrics: dict[str, float]) -> None:
        self.inner.on_step(step, metrics)
        if self.reporter is not None:
            self.reporter.step(step, metrics)
            self._tell()

    def on_checkpoint(self, step: int, path: Path) -> None:
        self.inner.on_checkpoint(step, path)
        if self.reporter is not None:
            self.reporter.checkpoint(step, path)

    def on_phase(self, name: str, done: int | None = None, total: int | None = None) -> None:
        self.inner.on_phase(name, done, total)

    def on_log(self, message: str) -> None:
        self.inner.on_log(message)

    def on_warning(self, message: str) -> None:
        self.inner.on_warning(message)

    def on_eval(self, step: int, metrics: dict[str, float]) -> None:
        self.inner.on_eval(step, metrics)
        if self.reporter is not None:
            self.reporter.eval(step, metrics)

    def on_samples(self, step: int, samples: list[Sample]) -> None:
        self.inner.on_samples(step, samples)
        if self.reporter is not None:
            self.reporter.samples(step, [dict(sample) for sample in samples])

    def on_config(self, step: int, version: int, changes: dict[str, Any]) -> None:
        self.inner.on_config(step, version, changes)
        if self.reporter is not None:
            self.reporter.steering(step, version, changes)

    def on_trackers(self, runs: dict[str, dict[str, str]]) -> None:
        self.inner.on_trackers(runs)


def backfill(reporter: Reporter, out_dir: Path) -> None:
    """The steps and evaluations a resumed run's folder holds (truncated to its checkpoint),
    in step order: a tracker that was slow or away when the run was interrupted had not taken
    them all, and the resumed run does not train them again. Those it took are skipped
    (`TrackerRun.delivered`)."""
    rows: list[tuple[int, int, dict[str, float]]] = []
    for order, name in enumerate(("metrics.jsonl", "eval.jsonl")):
        path = out_dir / name
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                rows.append((int(row["step"]), order, row))
    for step, order, row in sorted(rows, key=lambda r: (r[0], r[1])):
        if order == 0:
            reporter.step(step, row)
        else:
            reporter.eval(step, row)
