"""The pieces of `pdppo dev`'s supervision on their own: the restart policy's arithmetic, the
explanation of a death, log rotation, and the supervisor thread over real (tiny) processes."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click
import pytest

from pdppo.devstack.child import Child, describe_exit, read_tail, rotate_log
from pdppo.devstack.supervisor import RestartPolicy, RestartTracker, Supervisor
from tests.client.dev_process import running, started_pids


def delays(
    tracker: RestartTracker, deaths: int, every: float = 1.0, uptime: float = 1.0
) -> list[float | None]:
    """The restart delays (None: give up) for `deaths` deaths `every` seconds apart."""
    return [tracker.on_death(i * every, uptime) for i in range(deaths)]


def test_backoff_doubles_up_to_the_cap_and_gives_up_past_the_limit() -> None:
    policy = RestartPolicy(max_restarts=5, window_s=300, backoff_s=1, backoff_max_s=30)
    assert delays(RestartTracker(policy), 7) == [1, 2, 4, 8, 16, None, None]
    roomy = RestartPolicy(max_restarts=100, window_s=300, backoff_s=1, backoff_max_s=30)
    assert delays(RestartTracker(roomy), 8) == [1, 2, 4, 8, 16, 30, 30, 30]


def test_a_long_run_resets_the_backoff_and_old_deaths_leave_the_window() -> None:
    policy = RestartPolicy(max_restarts=2, window_s=100, backoff_s=1, reset_after_s=60)
    tracker = RestartTracker(policy)
    assert tracker.on_death(0, uptime=5) == 1
    assert tracker.on_death(10, uptime=5) == 2
    assert tracker.on_death(200, uptime=90) == 1  # ran 90 s: back to 1 s; 0 and 10 are old
    assert tracker.recent_deaths == 1
    # deaths further apart than the window never add up to a give-up
    assert None not in delays(RestartTracker(policy), 20, every=101)


def test_max_restarts_zero_gives_up_at_the_first_death() -> None:
    assert RestartTracker(RestartPolicy(max_restarts=0)).on_death(0, 1) is None


def test_the_default_limit_lets_the_worker_reaper_fail_a_poison_job_first() -> None:
    # The reaper fails a job after max_worker_losses + 1 dead workers, and the worker that does
    # it is one more restart: the supervisor must allow more than that.
    assert RestartPolicy.from_env({}).max_restarts == 5 > 3 + 1
    assert RestartPolicy.from_env({"PDPPO_MAX_WORKER_LOSSES": "10"}).max_restarts == 12
    custom = RestartPolicy.from_env({"PDPPO_DEV_MAX_RESTARTS": "2", "PDPPO_DEV_BACKOFF_S": "0.5"})
    assert (custom.max_restarts, custom.backoff_s, custom.window_s) == (2, 0.5, 300)
    with pytest.raises(click.ClickException, match="PDPPO_DEV_MAX_RESTARTS='many'"):
        RestartPolicy.from_env({"PDPPO_DEV_MAX_RESTARTS": "many"})
    with pytest.raises(click.ClickException, match="at least 0"):
        RestartPolicy.from_env({"PDPPO_DEV_BACKOFF_S": "-1"})


def test_describe_exit_names_the_signal_and_what_it_usually_means() -> None:
    assert describe_exit(-signal.SIGKILL) == (
        "killed by SIGKILL (the kernel's OOM killer sends this when memory runs out)"
    )
    assert describe_exit(-signal.SIGSEGV) == "killed by SIGSEGV (a crash in native code)"
    assert describe_exit(-signal.SIGUSR1) == "killed by SIGUSR1"
    assert describe_exit(3) == "exited with code 3"


def test_logs_rotate_past_their_size_and_tails_read_from_the_end(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text("old\n" * 100)
    rotate_log(log, max_bytes=1000)
    assert log.exists()  # 400 bytes: kept
    rotate_log(log, max_bytes=100)
    assert not log.exists() and (tmp_path / "worker.log.1").read_text() == "old\n" * 100
    rotate_log(log, max_bytes=100)  # nothing to rotate: no error
    log.write_text("".join(f"line {i}\n" for i in range(1000)))
    assert read_tail(log, 2) == "line 998\nline 999"
    assert read_tail(log, 5, start=log.stat().st_size - len("line 999\n")) == "line 999"


def wait(condition: Callable[[], object], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_supervisor_restarts_a_crashing_process_then_gives_up(tmp_path: Path) -> None:
    crash = "import os, signal; print('about to crash', flush=True); os.kill(os.getpid(), 11)"
    log = tmp_path / "crasher.log"
    log.write_text("kept from before\n")
    child = Child("crasher", [sys.executable, "-c", crash], {}, log)
    echoed: list[str] = []
    gave_up: list[str] = []
    policy = RestartPolicy(max_restarts=2, backoff_s=0.05)
    supervisor = Supervisor(policy, on_give_up=gave_up.append, echo=echoed.append)
    child.start()
    supervisor.watch(child)
    supervisor.start()
    try:
        wait(lambda: gave_up)
    finally:
        supervisor.stop(child.stop)
    text = log.read_text()
    assert text.startswith("kept from before\n")
    assert len(started_pids(log, "crasher")) == 3  # the first start and two restarts
    assert text.count("about to crash") == 3 and text.count("killed by SIGSEGV") == 3
    assert "gave up on crasher" in text
    assert gave_up == [supervisor.gave_up]
    assert "it died 3 times within 300s (at most 2 restarts allowed" in gave_up[0]
    assert sum("restarting crasher in" in line for line in echoed) == 2
    assert all("about to crash" in line for line in echoed if "last lines of" in line)


def test_supervisor_leaves_a_healthy_process_alone_and_stop_ends_it(tmp_path: Path) -> None:
    log = tmp_path / "sleeper.log"
    child = Child("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], {}, log)
    supervisor = Supervisor(RestartPolicy(), on_give_up=lambda m: None, echo=lambda m: None)
    child.start()
    supervisor.watch(child)
    supervisor.start()
    pid = child.pid
    assert pid is not None
    time.sleep(1)
    supervisor.stop(child.stop)
    assert not running(pid) and supervisor.gave_up is None
    assert started_pids(log, "sleeper") == [pid]
    assert "sleeper stopped by pdppo dev" in log.read_text()
