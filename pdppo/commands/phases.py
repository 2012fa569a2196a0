"""What a job is doing before and between its steps (loading the model, warm-up, evaluating,
saving), and what it warns about when it ends, as the CLI prints them.

A phase comes from the job record (`phase`), the event stream (`phase` events) or, for
`pdppo train`, the trainer's `on_phase` hook; all three are `{name, done, total}`. A warm-up of
a few hundred steps used to be a silent screen: on a terminal the progress line now says
`warm-up 12/65`, updated in place; in a log (no terminal) each phase gets a line when it starts,
then one per tenth of its progress and one at its end, so a long phase cannot flood the log.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

PROGRESS_LINES = 10  # lines a phase may print in a log, besides its first and its last


class Bar(Protocol):
    """What the display needs of a tqdm bar."""

    def write(self, s: str) -> None: ...

    def set_description_str(self, desc: str | None = None, refresh: bool = True) -> None: ...


def _plain(value: Any) -> Any:
    """A record field as plain data, whether the client model declares it or keeps it as an
    extra (a server newer than the client): a pydantic model is dumped, anything else kept."""
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if callable(dump) else value


def phase_text(phase: Any) -> str | None:
    """`warm-up 12/65`, `loading model`, `evaluating`; None for no phase (queued, ended)."""
    phase = _plain(phase)
    if not isinstance(phase, Mapping) or not phase.get("name"):
        return None
    done, total = phase.get("done"), phase.get("total")
    if isinstance(done, int) and isinstance(total, int):
        return f"{phase['name']} {done}/{total}"
    if isinstance(done, int):
        return f"{phase['name']} {done}"
    return str(phase["name"])


def warning_lines(warnings: Any) -> list[str]:
    """`warning (rewards_all_zero): every reward of every step was 0`, one per warning."""
    warnings = _plain(warnings)
    if not isinstance(warnings, list):
        return []
    lines = []
    for item in warnings:
        item = _plain(item)
        if isinstance(item, Mapping):
            lines.append(f"warning ({item.get('code', '?')}): {item.get('message', '')}")
    return lines


def job_warnings(job: Any) -> list[str]:
    return warning_lines(getattr(job, "warnings", None))


def job_phase(job: Any) -> str | None:
    return phase_text(getattr(job, "phase", None))


class PhaseDisplay:
    """Phase changes on a progress bar: in place on a terminal, a bounded number of lines in a
    log. `label` is the bar's own description (the job's name), restored while training, where
    the bar itself counts the steps."""

    def __init__(self, bar: Bar, label: str, tty: bool) -> None:
        self.bar = bar
        self.label = label
        self.tty = tty
        self.name: str | None = None
        self.shown_tenth = -1

    def show(self, name: str, done: int | None = None, total: int | None = None) -> None:
        text = phase_text({"name": name, "done": done, "total": total}) or name
        started = name != self.name
        if started:
            self.name = name
            self.shown_tenth = -1
            self.bar.write(f"phase: {text}")
        if self.tty:
            in_place = text if not self.label else f"{self.label}: {text}"
            in_place = self.label if name == "training" else in_place
            self.bar.set_description_str(in_place)
            return
        if name == "training" or not isinstance(done, int) or not isinstance(total, int):
            return  # the bar counts training steps; a phase without counts has its one line
        tenth = PROGRESS_LINES * done // total if total > 0 else PROGRESS_LINES
        if tenth > self.shown_tenth:
            if not started:
                self.bar.write(f"phase: {text}")
            self.shown_tenth = tenth
