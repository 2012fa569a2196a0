"""How the CLI prints a job's phase and warnings, from literal records and events shaped as the
API sends them (`phase: {name, done, total}`, `warnings: [{code, message}]`, SSE `phase`).

The end-to-end proof, a real warm-up seen through `pdppo submit --follow`, is
`test_phases_stack.py`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from pdppo.client import Client, Job
from pdppo.commands.jobs import follow_job, status_lines
from pdppo.commands.phases import PhaseDisplay, phase_text, warning_lines
from pdppo.commands.train import _progress

RECORD: dict[str, Any] = {
    "id": "job1",
    "status": "running",
    "name": "warm",
    "progress": {"step": 0, "total": 8},
    "phase": {"name": "warm-up", "done": 12, "total": 65},
    "warnings": [],
}
WARNINGS = [
    {"code": "no_reward_variance", "message": "every group had equal rewards: nothing learned"},
    {"code": "eval_unchanged", "message": "the held-out score never moved"},
]


class Recorder:
    """A bar that keeps what it is told: the lines above it and its description."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.descriptions: list[str | None] = []

    def write(self, s: str) -> None:
        self.lines.append(s)

    def set_description_str(self, desc: str | None = None, refresh: bool = True) -> None:
        self.descriptions.append(desc)


def test_phase_text() -> None:
    assert phase_text({"name": "warm-up", "done": 12, "total": 65}) == "warm-up 12/65"
    assert phase_text({"name": "loading model", "done": None, "total": None}) == "loading model"
    assert phase_text({"name": "evaluating", "done": 3, "total": None}) == "evaluating 3"
    assert phase_text(None) is None
    assert warning_lines(WARNINGS) == [
        "warning (no_reward_variance): every group had equal rewards: nothing learned",
        "warning (eval_unchanged): the held-out score never moved",
    ]
    assert warning_lines(None) == []


def test_status_shows_the_phase_while_running_and_the_warnings_at_the_end() -> None:
    running = Job.model_validate(RECORD)
    assert status_lines(running)[1:] == ["phase: warm-up 12/65"]
    ended = Job.model_validate(
        RECORD | {"status": "succeeded", "phase": None, "warnings": WARNINGS}
    )
    assert status_lines(ended)[1:] == [
        "warning (no_reward_variance): every group had equal rewards: nothing learned",
        "warning (eval_unchanged): the held-out score never moved",
    ]
    queued = Job.model_validate({"id": "job2", "status": "queued"})  # an older server
    assert status_lines(queued)[1:] == []


def _warm_up(display: PhaseDisplay, total: int = 65) -> None:
    display.show("loading model")
    for done in range(total + 1):
        display.show("warm-up", done, total)
    for step in range(1, 4):
        display.show("training", step, 8)


def test_a_log_gets_a_line_per_phase_and_per_tenth_not_per_event() -> None:
    bar = Recorder()
    _warm_up(PhaseDisplay(bar, "warm", tty=False))
    assert bar.lines == [
        "phase: loading model",
        "phase: warm-up 0/65",
        *[f"phase: warm-up {d}/65" for d in (7, 13, 20, 26, 33, 39, 46, 52, 59, 65)],
        "phase: training 1/8",
    ]
    assert bar.descriptions == []


def test_a_terminal_gets_the_progress_in_place() -> None:
    bar = Recorder()
    _warm_up(PhaseDisplay(bar, "warm", tty=True))
    assert bar.lines == ["phase: loading model", "phase: warm-up 0/65", "phase: training 1/8"]
    assert bar.descriptions[:3] == [
        "warm: loading model",
        "warm: warm-up 0/65",
        "warm: warm-up 1/65",
    ]
    assert bar.descriptions[66] == "warm: warm-up 65/65"
    assert bar.descriptions[67:] == ["warm", "warm", "warm"]  # the bar counts the steps


def _sse(events: list[tuple[str, dict[str, Any]]]) -> bytes:
    return b"".join(
        f"id: {i}-0\nevent: {name}\ndata: {json.dumps(data)}\n\n".encode()
        for i, (name, data) in enumerate(events, start=1)
    )


def test_follow_shows_phase_events_and_the_warnings_at_the_end(
    capsys: pytest.CaptureFixture[str],
) -> None:
    at = "2026-12-04T21:00:00Z"
    events: list[tuple[str, dict[str, Any]]] = [
        ("status", {"status": "running"}),
        ("phase", {"name": "loading model", "done": None, "total": None, "at": at}),
        *[("phase", {"name": "warm-up", "done": d, "total": 20, "at": at}) for d in range(21)],
        ("phase", {"name": "training", "done": 0, "total": 2, "at": at}),
        ("metrics", {"step": 1, "total": 2, "metrics": {"reward_mean": 0.5}}),
        ("metrics", {"step": 2, "total": 2, "metrics": {"reward_mean": 0.5}}),
        ("done", {"status": "succeeded"}),
    ]
    gets: Iterator[dict[str, Any]] = iter(
        [RECORD | {"phase": None}, RECORD | {"status": "succeeded", "warnings": WARNINGS}]
    )

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            return httpx.Response(
                200, headers={"content-type": "text/event-stream"}, content=_sse(events)
            )
        return httpx.Response(200, json=next(gets))

    with Client("http://pdppo.test", "key", transport=httpx.MockTransport(handler)) as client:
        assert follow_job(client, "job1") == "succeeded"
    out = capsys.readouterr().out.splitlines()
    assert out == [  # the record said running already: no status line for it
        "phase: loading model",
        "phase: warm-up 0/20",
        *[f"phase: warm-up {d}/20" for d in (2, 4, 6, 8, 10, 12, 14, 16, 18, 20)],
        "phase: training 0/2",
        "status: succeeded",
        "warning (no_reward_variance): every group had equal rewards: nothing learned",
        "warning (eval_unchanged): the held-out score never moved",
    ]


def test_train_shows_the_trainers_phases(capsys: pytest.CaptureFixture[str]) -> None:
    progress = _progress(8, quiet=True)
    progress.on_phase("loading model")
    for done in range(11):
        progress.on_phase("warm-up", done, 10)
    progress.on_phase("training", 0, 8)
    progress.bar.close()
    assert capsys.readouterr().out.splitlines() == [
        "phase: loading model",
        *[f"phase: warm-up {d}/10" for d in range(11)],
        "phase: training 0/8",
    ]


def test_a_phase_of_zero_items_gets_its_line_and_counts_alone_are_not_a_fraction() -> None:
    bar = Recorder()
    display = PhaseDisplay(bar, "job", tty=False)
    display.show("evaluating", 0, 0)  # an empty eval set: done at once, no division by zero
    display.show("evaluating", 0, 0)
    assert bar.lines == ["phase: evaluating 0/0"]
    assert phase_text({"name": "saving", "done": None, "total": 4}) == "saving"


def test_train_logs_go_to_stdout_when_quiet_and_above_the_bar_otherwise(
    capsys: pytest.CaptureFixture[str],
) -> None:
    quiet = _progress(8, quiet=True)
    quiet.on_log("eval: score 0.50")
    quiet.bar.close()
    assert capsys.readouterr().out == "eval: score 0.50\n"
    shown = _progress(8, quiet=False)
    written: list[str] = []
    shown.bar.write = written.append  # tqdm.write is a classmethod: this bar's own, recorded
    shown.on_log("eval: score 0.75")
    shown.bar.close()
    assert written == ["eval: score 0.75"]
    assert capsys.readouterr().out == ""
