"""Every tracker of one run behind one object, fed by the training thread.

The trainer's callback (`core.training.reporting`) hands each step's metrics, evaluations,
samples, steering changes and checkpoints to `Reporter`, which queues one report per tracker
(`core.tracking.channel`) and returns at once. What the trackers' runs are, and how far each
got, is kept in the run's folder (`tracking.json`, rewritten as reports are delivered): a
resumed run (`resume_step`) opens the same tracker runs and skips what they took already, so no
step is logged twice (TensorBoard, whose files may lag behind what it took, is written again
from the checkpoint on and its reader drops the older copies: `core.tracking.tb`).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from core.tracking.base import Tracker, TrackerRun, TrackingOptions, flatten, require_trackers
from core.tracking.channel import Channel, Report

STATE_FILE = "tracking.json"
DROP_NOTE_SECONDS = 30.0
"""A run's log says at most this often that reports to a tracker were dropped."""


def make_tracker(name: str, options: TrackingOptions, out_dir: Path) -> Tracker:
    """The tracker called `name` (its library is imported here, on first use)."""
    if name == "tensorboard":
        from core.tracking.tb import TensorBoardTracker

        return TensorBoardTracker(options, out_dir)
    if name == "mlflow":
        from core.tracking.mlflow_run import MlflowTracker

        return MlflowTracker(options, out_dir)
    if name == "wandb":
        from core.tracking.wandb_run import WandbTracker

        return WandbTracker(options, out_dir)
    raise ValueError(f"unknown tracker {name!r}")


class Reporter:
    """Reports to `options.report_to`; `resume_step`: the checkpoint a resumed run continues
    from (None: a fresh run, which starts new tracker runs). `make`: builds a tracker by name
    (tests pass stand-ins for the buffer's behaviour)."""

    def __init__(
        self,
        options: TrackingOptions,
        out_dir: Path,
        *,
        resume_step: int | None = None,
        make: Callable[[str, TrackingOptions, Path], Tracker] = make_tracker,
    ) -> None:
        if make is make_tracker:
            require_trackers(options.report_to)
        self.options = options
        self.state_path = Path(out_dir) / STATE_FILE
        previous = self._load() if resume_step is not None else {}
        if resume_step is None:
            with contextlib.suppress(FileNotFoundError):
                self.state_path.unlink()  # a fresh run owns its folder (as its metrics)
        self._lock = threading.Lock()
        self.channels = [
            Channel(
                make(name, options, Path(out_dir)),
                options,
                previous.get(name),
                resume_step,
                self._delivered,
            )
            for name in dict.fromkeys(options.report_to)
        ]
        self._told: dict[str, tuple[int, float]] = {}  # per tracker: drops told, when
        self._runs_told: set[str] = set()

    def start(self) -> None:
        for channel in self.channels:
            channel.start()

    def step(self, step: int, metrics: Mapping[str, float]) -> None:
        named = {f"train/{k}": float(v) for k, v in metrics.items() if k != "step"}
        self._put("step", step, lambda t: t.metrics(step, named), (step, named))

    def eval(self, step: int, metrics: Mapping[str, float]) -> None:
        named = {f"eval/{k}": float(v) for k, v in metrics.items() if k != "step"}
        self._put("eval", step, lambda t: t.metrics(step, named), (step, named))

    def samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        kept = [dict(row) for row in rows]
        self._put("samples", step, lambda t: t.table(step, "samples", kept))

    def config(self, config: Mapping[str, Any]) -> None:
        flat = flatten(config)
        self._put("config", 0, lambda t: t.config(flat))

    def steering(self, step: int, version: int, changes: Mapping[str, Any]) -> None:
        data = {"version": version, "from_step": step + 1, "changes": dict(changes)}
        self._put("steering", version, lambda t: t.event(step, "config", data))

    def checkpoint(self, step: int, path: Path) -> None:
        data = {"step": step, "path": str(path)}
        self._put("checkpoint", step, lambda t: t.event(step, "checkpoint", data))

    def new_runs(self) -> dict[str, dict[str, str]]:
        """The tracker runs opened since last asked: {tracker: {run_id, url}}."""
        out: dict[str, dict[str, str]] = {}
        for channel in self.channels:
            if channel.run is not None and channel.name not in self._runs_told:
                self._runs_told.add(channel.name)
                out[channel.name] = channel.run.public()
        return out

    def notes(self, now: float | None = None) -> list[str]:
        """Lines for the run's log: reports dropped since last told (at most every
        `DROP_NOTE_SECONDS` per tracker)."""
        now = time.monotonic() if now is None else now
        lines = []
        for channel in self.channels:
            told, at = self._told.get(channel.name, (0, -DROP_NOTE_SECONDS))
            if channel.dropped > told and now - at >= DROP_NOTE_SECONDS:
                self._told[channel.name] = (channel.dropped, now)
                lines.append(
                    f"reports to {channel.name}: {channel.dropped} dropped so far, the tracker "
                    f"being unreachable or slow ({channel.last_error}); training goes on"
                )
        return lines

    def close(self) -> list[str]:
        """Deliver what is queued, waiting `options.close_seconds` at most for all trackers
        together; lines for the run's log on what did not make it."""
        deadline = time.monotonic() + self.options.close_seconds
        done = {channel.name: channel.close(deadline) for channel in self.channels}
        lines = []
        for channel in self.channels:
            if not done[channel.name]:
                lines.append(
                    f"reports to {channel.name}: gave up after {self.options.close_seconds:g} s "
                    f"at the end of the run ({channel.last_error or 'the tracker is slow'}); "
                    f"{channel.delivered} delivered, {channel.dropped} dropped"
                )
            elif channel.dropped:
                lines.append(
                    f"reports to {channel.name}: {channel.delivered} delivered, "
                    f"{channel.dropped} dropped ({channel.last_error})"
                )
        return lines

    def _put(
        self,
        kind: str,
        key: int,
        send: Callable[[Tracker], None],
        metrics: tuple[int, Mapping[str, float]] | None = None,
    ) -> None:
        report = Report(kind, key, send, metrics)
        for channel in self.channels:
            channel.put(report)

    def _delivered(self, channel: Channel) -> None:
        """Called from a channel's thread: the run's progress, on disk (atomically)."""
        with self._lock:
            state = self._load()
            if channel.run is not None:
                state[channel.name] = channel.run
            raw = {name: asdict(run) for name, run in state.items()}
            tmp = self.state_path.with_name(f".{STATE_FILE}.{channel.name}.tmp")
            tmp.write_text(json.dumps(raw, indent=1), encoding="utf-8")
            os.replace(tmp, self.state_path)

    def _load(self) -> dict[str, TrackerRun]:
        try:
            raw = json.loads(self.state_path.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return {}
        return {name: TrackerRun(**fields) for name, fields in raw.items()}
