"""TensorBoard: event files written with `torch.utils.tensorboard` (the `tensorboard` extra).

Where: `<out_dir>/tensorboard` (a service job's folder, so the files are in its download), or
`<PDPPO_TENSORBOARD_DIR>/<run name>` when the operator gives a root. Every report is flushed
before it counts as delivered (`tracking.json`); a resumed run writes into the same folder with
`purge_step` set to the step after the last one delivered: TensorBoard's reader drops whatever
the earlier attempt wrote from that step on, and the resumed run sends those steps again, so
each step reads back once. The run's samples, config,
steering changes and checkpoints are text summaries (the Text tab)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from core.tracking.base import Tracker, TrackerRun


class TensorBoardTracker(Tracker):
    name = "tensorboard"

    def log_dir(self) -> Path:
        root = self.options.tensorboard_dir
        return root / self.options.run_name if root is not None else self.out_dir / "tensorboard"

    def open(self, previous: TrackerRun | None, resume_step: int | None) -> TrackerRun:
        from torch.utils.tensorboard import SummaryWriter

        log_dir = self.log_dir()
        if previous is None:
            shutil.rmtree(log_dir, ignore_errors=True)  # a fresh run's own folder
            purge = None
            delivered: dict[str, int] = {}
        else:
            # what was flushed before the interruption stays; anything written after (the
            # run's state is saved after each flush) is dropped by the reader and sent again
            delivered = dict(previous.delivered)
            purge = delivered.get("step", 0) + 1
        self.writer = SummaryWriter(str(log_dir), purge_step=purge, flush_secs=5)
        return TrackerRun(self.name, run_id=str(log_dir), delivered=delivered)

    def metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.metrics_many([(step, metrics)])

    def metrics_many(self, items: Sequence[tuple[int, Mapping[str, float]]]) -> None:
        """Flushed before the channel counts them delivered: a run killed with -9 loses
        nothing it counted (the file's buffer would be lost with it, the OS's is not)."""
        for step, metrics in items:
            for name, value in metrics.items():
                self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def table(self, step: int, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        if not rows:
            return
        columns = list(rows[0])
        lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
        for row in rows:
            cells = (_cell(row.get(column)) for column in columns)
            lines.append("| " + " | ".join(cells) + " |")
        self.writer.add_text(name, "\n".join(lines), step)
        self.writer.flush()

    def config(self, config: Mapping[str, Any]) -> None:
        self.writer.add_text("config", _code(config), 0)

    def event(self, step: int, tag: str, data: Mapping[str, Any]) -> None:
        self.writer.add_text(f"events/{tag}", _code(data), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _cell(value: Any) -> str:
    """A markdown table cell: pipes and newlines would end it."""
    return str(value).replace("|", "\\|").replace("\n", "<br>")


def _code(data: Mapping[str, Any]) -> str:
    """JSON as a markdown code block (indented four spaces: TensorBoard renders markdown)."""
    text = json.dumps(data, indent=1, sort_keys=True, default=str)
    return "\n".join("    " + line for line in text.splitlines())
