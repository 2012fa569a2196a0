"""The buffer between the training thread and a tracker (`core.tracking.channel`, `reporter`),
with stand-in trackers whose failures the test controls: a report never blocks, a full queue
drops its oldest and counts them, a failing tracker is retried in order, closing is bounded,
and a resumed run skips what its tracker run took already."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from core.tracking import Reporter, Tracker, TrackerRun, TrackingOptions
from core.tracking.base import flatten
from core.tracking.reporter import make_tracker


class StandIn(Tracker):
    """Records what it was told; `gate` holds every call until set; the first `fail` calls
    raise."""

    name = "standin"

    def __init__(self, options: TrackingOptions, out_dir: Path, fail: int = 0) -> None:
        super().__init__(options, out_dir)
        self.gate = threading.Event()
        self.gate.set()
        self.fail = fail
        self.calls = 0
        self.steps: list[int] = []
        self.batches: list[list[int]] = []  # steps sent together
        self.sent: list[tuple[int, dict[str, float]]] = []  # (step, metrics) as told
        self.configs: list[dict[str, Any]] = []
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        self.call_times: list[float] = []
        self.closed = False

    def _call(self) -> None:
        self.gate.wait()
        self.calls += 1
        self.call_times.append(time.monotonic())
        if self.calls <= self.fail:
            raise ConnectionError(f"refused (call {self.calls})")

    def open(self, previous: TrackerRun | None, resume_step: int | None) -> TrackerRun:
        self._call()
        delivered = dict(previous.delivered) if previous is not None else {}
        return TrackerRun(self.name, run_id="run-1", url="http://t/run-1", delivered=delivered)

    def metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._call()
        self.steps.append(step)
        self.sent.append((step, dict(metrics)))

    def metrics_many(self, items: Sequence[tuple[int, Mapping[str, float]]]) -> None:
        self._call()
        self.batches.append([step for step, _ in items])
        self.steps.extend(step for step, _ in items)
        self.sent.extend((step, dict(metrics)) for step, metrics in items)

    def table(self, step: int, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        self._call()

    def config(self, config: Mapping[str, Any]) -> None:
        self._call()
        self.configs.append(dict(config))

    def event(self, step: int, tag: str, data: Mapping[str, Any]) -> None:
        self._call()
        self.events.append((step, tag, dict(data)))

    def close(self) -> None:
        self._call()
        self.closed = True


def reporter(
    tmp_path: Path, tracker: StandIn, resume_step: int | None = None, **options: Any
) -> Reporter:
    opts = TrackingOptions(
        report_to=("standin",), retry_seconds=0.01, max_retry_seconds=0.05, **options
    )
    return Reporter(opts, tmp_path, resume_step=resume_step, make=lambda *_: tracker)


def test_full_queue_drops_the_oldest_and_never_blocks(tmp_path: Path) -> None:
    tracker = StandIn(TrackingOptions(), tmp_path)
    tracker.gate.clear()  # the tracker hangs in open(): nothing is delivered
    rep = reporter(tmp_path, tracker, queue_size=5)
    rep.start()
    started = time.monotonic()
    for step in range(1, 13):
        rep.step(step, {"loss": float(step)})
    assert time.monotonic() - started < 0.5  # 12 reports to a hung tracker: no wait
    channel = rep.channels[0]
    assert channel.dropped == 7 and channel.pending == 5
    assert rep.notes(now=1e9) == [
        "reports to standin: 7 dropped so far, the tracker being unreachable or slow (None); "
        "training goes on"
    ]
    assert rep.notes(now=1e9 + 1) == []  # told once until more are dropped (and 30 s pass)
    tracker.gate.set()
    assert rep.close() == ["reports to standin: 5 delivered, 7 dropped (None)"]
    assert tracker.steps == [8, 9, 10, 11, 12] and tracker.closed


def test_failing_tracker_is_retried_in_order(tmp_path: Path) -> None:
    tracker = StandIn(TrackingOptions(), tmp_path, fail=3)  # open fails 3 times
    rep = reporter(tmp_path, tracker)
    rep.start()
    for step in (1, 2, 3):
        rep.step(step, {"loss": 0.5})
    assert rep.close() == []
    assert tracker.steps == [1, 2, 3] and tracker.closed
    assert rep.channels[0].failures == 3 and rep.channels[0].dropped == 0
    assert rep.channels[0].last_error == "ConnectionError: refused (call 3)"


def test_close_gives_up_after_its_bound(tmp_path: Path) -> None:
    tracker = StandIn(TrackingOptions(), tmp_path)
    rep = reporter(tmp_path, tracker, close_seconds=0.3)
    rep.start()
    rep.step(1, {"loss": 0.5})
    deadline = time.monotonic() + 5
    while rep.channels[0].delivered < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    tracker.gate.clear()  # now it hangs: step 2 never gets through
    rep.step(2, {"loss": 0.5})
    rep.step(3, {"loss": 0.5})
    started = time.monotonic()
    lines = rep.close()
    waited = time.monotonic() - started
    assert 0.25 < waited < 1.5
    assert lines == [
        "reports to standin: gave up after 0.3 s at the end of the run (the tracker is slow); "
        "1 delivered, 2 dropped"
    ]
    tracker.gate.set()


def test_always_failing_tracker_is_given_up_at_close(tmp_path: Path) -> None:
    tracker = StandIn(TrackingOptions(), tmp_path, fail=10**9)
    rep = reporter(tmp_path, tracker, close_seconds=0.2)
    rep.start()
    rep.step(1, {"loss": 0.5})
    lines = rep.close()
    assert len(lines) == 1 and "gave up after 0.2 s" in lines[0]
    assert "ConnectionError: refused" in lines[0] and "0 delivered, 1 dropped" in lines[0]


def test_resume_continues_the_run_and_skips_what_it_took(tmp_path: Path) -> None:
    first = StandIn(TrackingOptions(), tmp_path)
    rep = reporter(tmp_path, first)
    rep.start()
    for step in (1, 2, 3, 4):
        rep.step(step, {"loss": 0.5})
    rep.close()
    assert rep.new_runs() == {"standin": {"run_id": "run-1", "url": "http://t/run-1"}}
    assert rep.new_runs() == {}  # told once
    # killed after step 4 was reported, resumed from the checkpoint of step 2: steps 3 and 4
    # are trained again and must not reach the tracker twice
    second = StandIn(TrackingOptions(), tmp_path)
    rep = reporter(tmp_path, second, resume_step=2)
    rep.start()
    for step in (3, 4, 5, 6):
        rep.step(step, {"loss": 0.5})
    rep.close()
    assert first.steps == [1, 2, 3, 4] and second.steps == [5, 6]


def test_fresh_run_starts_a_new_tracker_run(tmp_path: Path) -> None:
    first = StandIn(TrackingOptions(), tmp_path)
    rep = reporter(tmp_path, first)
    rep.start()
    rep.step(1, {"loss": 0.5})
    rep.close()
    second = StandIn(TrackingOptions(), tmp_path)
    rep = reporter(tmp_path, second)  # not a resume: nothing is skipped
    rep.start()
    rep.step(1, {"loss": 0.5})
    rep.close()
    assert second.steps == [1]


def test_missing_tracker_library_names_its_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from core.extras import MissingExtra
    from tests.support.trainer_runs import small_config

    monkeypatch.setitem(__import__("sys").modules, "wandb", None)
    from core.training.trainer import train

    with pytest.raises(MissingExtra) as caught:
        train(small_config(report_to=["wandb"]), tmp_path)
    assert str(caught.value) == (
        "report_to: wandb needs the wandb extra: pip install 'pdppo[wandb]' (wandb is missing)"
    )
    assert not (tmp_path / "metrics.jsonl").exists()  # refused before any step


def test_metrics_queued_behind_a_slow_tracker_go_together(tmp_path: Path) -> None:
    tracker = StandIn(TrackingOptions(), tmp_path)
    tracker.gate.clear()
    rep = reporter(tmp_path, tracker)
    rep.start()
    for step in range(1, 8):
        rep.step(step, {"loss": 0.5})
    rep.checkpoint(7, tmp_path)  # not metrics: sent on its own, after them
    rep.step(8, {"loss": 0.5})
    tracker.gate.set()
    assert rep.close() == []
    assert tracker.batches == [[1, 2, 3, 4, 5, 6, 7]] and tracker.steps == list(range(1, 9))


def test_a_report_after_the_close_is_dropped_and_counted(tmp_path: Path) -> None:
    """A step reported while the run closes (a callback racing the end) reaches no tracker: the
    channel counts it dropped, once, and the closed tracker is not called again."""
    tracker = StandIn(TrackingOptions(), tmp_path)
    rep = reporter(tmp_path, tracker)
    rep.start()
    rep.step(1, {"loss": 0.5})
    assert rep.close() == []
    rep.step(2, {"loss": 0.25})
    assert rep.channels[0].dropped == 1 and rep.channels[0].pending == 0
    assert tracker.steps == [1]


def test_a_config_is_flattened_to_dotted_scalars() -> None:
    """Trackers take flat scalar parameters: nested sections become dotted names, lists and
    tuples JSON text, everything else as it is."""
    config = {"optim": {"lr": 1e-3, "betas": [0.9, 0.99]}, "seed": 3, "shape": (2, 4), "x": None}
    assert flatten(config) == {
        "optim.lr": 1e-3,
        "optim.betas": "[0.9, 0.99]",
        "seed": 3,
        "shape": "[2, 4]",
        "x": None,
    }


def test_an_unknown_tracker_name_is_refused(tmp_path: Path) -> None:
    """The spec's names are checked before (`report_to`'s literal); a name that slips past is
    an error, not some other tracker."""
    with pytest.raises(ValueError, match="unknown tracker 'nope'"):
        make_tracker("nope", TrackingOptions(), tmp_path)


def test_a_fresh_run_delivers_its_config_metrics_and_steering_as_named(tmp_path: Path) -> None:
    """What a tracker is told: the config at key 0 (a fresh run has delivered nothing, so
    nothing is skipped), each step's metrics under `train/` without the step itself, and a
    steering change as a `config` event from the step after it."""
    tracker = StandIn(TrackingOptions(), tmp_path)
    rep = reporter(tmp_path, tracker)
    rep.start()
    rep.config({"optim": {"lr": 0.1}})
    rep.step(1, {"step": 1, "loss": 0.5})
    rep.steering(4, 2, {"optim.lr": 0.05})
    rep.close()
    assert tracker.configs == [{"optim.lr": 0.1}]
    assert tracker.sent == [(1, {"train/loss": 0.5})]
    assert tracker.events == [
        (4, "config", {"version": 2, "from_step": 5, "changes": {"optim.lr": 0.05}})
    ]


def test_a_failed_tracker_waits_the_default_half_second_before_trying_again(
    tmp_path: Path,
) -> None:
    """The operator's default retry wait (TrackingOptions.retry_seconds, 0.5 s, doubling): a
    tracker that is down is not called again at once, over and over."""
    tracker = StandIn(TrackingOptions(), tmp_path, fail=1)  # open fails once
    rep = Reporter(TrackingOptions(report_to=("standin",)), tmp_path, make=lambda *_: tracker)
    rep.start()
    rep.close()
    assert tracker.calls == 3 and tracker.closed  # open failed, open, close
    assert tracker.call_times[1] - tracker.call_times[0] >= 0.5
