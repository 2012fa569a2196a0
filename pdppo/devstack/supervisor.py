"""Keeps the dev stack's children alive: explain a death, restart with backoff, never crash-loop.

A child that dies on its own (the OOM killer, a segfault, `kill -9`, an exit) is reported on the
terminal and in its log (why, how long it ran, its peak memory, the last lines it wrote) and
started again after a backoff: 1 s, 2 s, 4 s ... up to 30 s, back to 1 s once a run has lasted a
minute. A child that dies more than `max_restarts` times within `window_s` is given up on, and
the whole stack stops with a non-zero exit: a job that kills every worker it lands on must end in
a clear message, not in an endless loop.

The default allows at least PDPPO_MAX_WORKER_LOSSES + 2 restarts in the window: the worker's
reaper fails a job after it has taken down that many + 1 workers, and that takes one restart
more, so a poison job ends failed while `pdppo dev` stays up, and the supervisor gives up only if
something else keeps killing the worker.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import click

from pdppo.devstack import launch
from pdppo.devstack.child import Child

POLL_INTERVAL_S = 0.25
DEFAULT_MAX_RESTARTS = 5
DEFAULT_MAX_WORKER_LOSSES = 3  # pdppo.settings' default for PDPPO_MAX_WORKER_LOSSES


@dataclass(frozen=True)
class RestartPolicy:
    """When to restart a dead child, and when to stop trying.

    Tunable through environment variables (PDPPO_DEV_MAX_RESTARTS, PDPPO_DEV_RESTART_WINDOW_S,
    PDPPO_DEV_BACKOFF_S, PDPPO_DEV_BACKOFF_MAX_S, PDPPO_DEV_BACKOFF_RESET_S) rather than options:
    they are for tests and unusual machines, not for everyday use."""

    max_restarts: int = DEFAULT_MAX_RESTARTS  # within window_s; 0 gives up at the first death
    window_s: float = 300.0
    backoff_s: float = 1.0  # the first delay; doubled after each death
    backoff_max_s: float = 30.0
    reset_after_s: float = 60.0  # a run this long resets the delay to backoff_s

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> RestartPolicy:
        def number(name: str, default: float, minimum: float) -> float:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                value = float(raw)
            except ValueError:
                raise click.ClickException(f"{name}={raw!r} is not a number") from None
            if value < minimum:
                raise click.ClickException(f"{name}={raw!r} must be at least {minimum:g}")
            return value

        losses = int(number("PDPPO_MAX_WORKER_LOSSES", DEFAULT_MAX_WORKER_LOSSES, 0))
        default_restarts = max(DEFAULT_MAX_RESTARTS, losses + 2)
        return cls(
            max_restarts=int(number("PDPPO_DEV_MAX_RESTARTS", default_restarts, 0)),
            window_s=number("PDPPO_DEV_RESTART_WINDOW_S", cls.window_s, 1),
            backoff_s=number("PDPPO_DEV_BACKOFF_S", cls.backoff_s, 0),
            backoff_max_s=number("PDPPO_DEV_BACKOFF_MAX_S", cls.backoff_max_s, 0),
            reset_after_s=number("PDPPO_DEV_BACKOFF_RESET_S", cls.reset_after_s, 0),
        )


@dataclass
class RestartTracker:
    """One child's recent deaths and its next backoff; pure bookkeeping, times passed in."""

    policy: RestartPolicy
    deaths: deque[float] = field(default_factory=deque)
    next_delay: float | None = None

    def on_death(self, now: float, uptime: float) -> float | None:
        """Seconds to wait before restarting, or None when the child has died too often."""
        if self.next_delay is None or uptime >= self.policy.reset_after_s:
            self.next_delay = self.policy.backoff_s
        self.deaths.append(now)
        while self.deaths and now - self.deaths[0] > self.policy.window_s:
            self.deaths.popleft()
        if len(self.deaths) > self.policy.max_restarts:
            return None
        delay = min(self.next_delay, self.policy.backoff_max_s)
        self.next_delay = min(max(delay * 2, self.policy.backoff_s), self.policy.backoff_max_s)
        return delay

    @property
    def recent_deaths(self) -> int:
        return len(self.deaths)


def _times(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines()) or prefix + "(empty)"


class Supervisor:
    """A thread that watches the supervised children, restarts them, or gives up.

    The same thread starts every restarted child and stays alive until `stop()` has stopped
    them all: Linux sends the parent-death signal when the *thread* that forked a child ends, so a
    thread that quit early would take its children with it."""

    def __init__(
        self,
        policy: RestartPolicy,
        on_give_up: Callable[[str], None],
        echo: Callable[[str], None] = lambda text: click.echo(text, err=True),
    ) -> None:
        self.policy = policy
        self.gave_up: str | None = None  # the message, once given up
        self._on_give_up = on_give_up
        self._echo = echo
        self._watched: list[Child] = []
        self._trackers: dict[str, RestartTracker] = {}
        self._restart_at: dict[str, float] = {}  # dead children waiting for their backoff
        self._lock = threading.Lock()  # held while deciding, restarting or stopping
        self._stopping = threading.Event()
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pdppo-dev-supervisor", daemon=True)

    def watch(self, child: Child) -> None:
        """From now on a death of `child` is restarted rather than fatal."""
        with self._lock:
            if child not in self._watched:
                self._watched.append(child)
                self._trackers[child.name] = RestartTracker(self.policy)

    def start(self) -> None:
        self._thread.start()

    def stop(self, stop_children: Callable[[], None]) -> None:
        """No more restarts; run `stop_children` once no restart is half done; let the thread go."""
        self._stopping.set()
        try:
            with self._lock:
                stop_children()
        finally:
            self._finished.set()
            if self._thread.is_alive():
                self._thread.join(5)

    def _run(self) -> None:
        try:
            while not self._stopping.is_set() and self.gave_up is None:
                with self._lock:
                    if self._stopping.is_set():
                        break
                    try:
                        self._tick(time.monotonic())
                    except Exception as exc:  # e.g. a restart that cannot even fork
                        message = f"could not supervise the stack: {exc!r}"
                        self._give_up(message, message)
                self._stopping.wait(POLL_INTERVAL_S)
        finally:
            self._finished.wait()  # keep the children's parent thread alive until they are stopped

    def _tick(self, now: float) -> None:
        for child in self._watched:
            restart_at = self._restart_at.get(child.name)
            if restart_at is not None:
                if now >= restart_at:
                    del self._restart_at[child.name]
                    child.start()
                    self._echo(f"pdppo dev: {child.name} restarted (pid {child.pid})")
                continue
            if child.proc is None or child.poll() is None:
                continue
            self._on_death(child, now)
            if self.gave_up is not None:
                return

    def _on_death(self, child: Child, now: float) -> None:
        report, uptime = child.death_report(), child.uptime()
        tail = _indent(child.log_tail())
        child.note(f"{child.name} exited at {launch.utc_now()}: {report}")
        child.kill_leftovers()
        tracker = self._trackers[child.name]
        delay = tracker.on_death(now, uptime)
        self._echo(f"pdppo dev: {report}.\n  last lines of {child.log_path}:\n{tail}")
        window, allowed = f"{self.policy.window_s:g}s", _times(self.policy.max_restarts, "restart")
        if delay is not None:
            self._echo(
                f"pdppo dev: restarting {child.name} in {delay:g}s (death "
                f"{tracker.recent_deaths} within {window}; at most {allowed} in that window)"
            )
            self._restart_at[child.name] = now + delay
            return
        message = (
            f"gave up on the {child.name}: it died {_times(tracker.recent_deaths, 'time')} "
            f"within {window} (at most {allowed} allowed, PDPPO_DEV_MAX_RESTARTS); the last "
            f"time: {report}. Its log is {child.log_path}."
        )
        if child.name == "worker":
            message += (
                " If a job takes the worker down, `pdppo list` shows it and `pdppo cancel ID`"
                " keeps it from running again."
            )
        child.note(f"gave up on {child.name} at {launch.utc_now()}")
        self._give_up(message, f"giving up on the {child.name}; stopping the stack")

    def _give_up(self, message: str, announce: str) -> None:
        """The full message ends `pdppo dev`'s output, after the stack has stopped."""
        self.gave_up = message
        self._echo(f"pdppo dev: {announce}")
        self._on_give_up(message)


def interrupt_main_thread() -> None:
    """Unwinds the main thread into the ordered shutdown, exactly as SIGTERM from outside does:
    it may be blocked following the demo's event stream, which only a signal interrupts."""
    main = threading.main_thread().ident
    if main is not None:
        signal.pthread_kill(main, signal.SIGTERM)
