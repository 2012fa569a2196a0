"""The grading server: graders run in a child process, so a grader that hangs or crashes costs
one completion's score, never the job.

Python cannot interrupt a thread stuck inside a regex match, a sympy simplification or an
operator's plugin; only a process can be killed. So the trainer's process (the parent) keeps one
child, started lazily and reused across steps, and sends it a whole batch; the child grades the
items in order and answers each as soon as it is done; the parent gives each item
`timeout_seconds` from the moment the previous one came back. Past that it kills the child
(SIGKILL), marks the item timed out, starts a new child and sends it the items left. A child that
dies in the middle of an item (a segfault, `os._exit` in a plugin, the kernel's OOM killer) costs
that item an error and is restarted the same way.

The child is a fresh interpreter (`sys.executable`), not a fork: it shares none of the trainer's
torch or CUDA state, and it imports `core.graders` without running `core/__init__.py` (which
imports torch: 5 s and 300 MB per start), nor the parent's `__main__` (which multiprocessing's
spawn would re-import: a Celery worker, a pytest session). Parent and child speak JSON lines over
the child's stdin and stdout; in the child, fd 1 is pointed at stderr before any grader loads, so
a plugin that prints cannot corrupt the protocol. The child dies with its parent: it exits on EOF
of its stdin, and on Linux the kernel sends it SIGKILL when the parent dies (PR_SET_PDEATHSIG),
which also covers a child busy inside a hung grader. Loading a tenant's python grader runs its
top level (`core.graders.hosted`): the child tells the parent when each starts, and from then the
parent gives it `GraderOptions.python_load_seconds`, not the minute of STARTUP_SECONDS that an
operator's plugin imports may need; a top level that raises, exits or runs past that is a
`GraderLoadError` from `start()`. Caveat of PDEATHSIG: it fires when the
*thread* that started the child ends; a server used from a short-lived thread is then restarted
on its next batch, at the cost of one start.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from core.config.graders import GraderConfig
from core.graders.base import GraderLoadError, Record, check_unit
from core.graders.options import LOAD_SETTING, GraderOptions
from core.process.parent_death import die_with_parent

STARTUP_SECONDS = 60.0
"""How long a new child may take to import the graders (and a plugin's dependencies)."""

MIN_WRITE_SECONDS = 10.0
"""Sending a batch gets at least this long (a live child reads it at once)."""

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the folder that holds core/

# Run with `python -P -c`: -P keeps the current directory off sys.path (a stray json.py there
# must not shadow the standard library). `core` is made a bare package (its __path__ only), so
# `core.graders` imports without `core/__init__.py` and its torch import.
_BOOT = """\
import sys, types
root = sys.argv[1]
sys.path.insert(0, root)
core = types.ModuleType("core")
core.__path__ = [root + "/core"]
sys.modules["core"] = core
from core.graders.server import serve
serve(int(sys.argv[2]))
"""


@dataclass(frozen=True)
class Outcome:
    """One item's result. A failed item scores 0: `failure` says why, `message` what."""

    value: float
    parts: dict[str, float] = field(default_factory=dict)
    failure: Literal["error", "timeout"] | None = None
    message: str = ""


class StartFailed(RuntimeError):
    """The grading server could not start for a reason other than a tenant's code: no
    interpreter, out of processes, a plugin that fails to import, a start past STARTUP_SECONDS."""


class _Unsendable(Exception):
    pass


class GradingServer:
    """The parent's side: `grade(items)` returns one Outcome per item, in order, within about
    `timeout_seconds` per item (plus a restart after each timeout), and within
    `batch_timeout_seconds` for the whole batch: a grader that hangs on every completion would
    otherwise cost a 512-completion step 512 timeouts; the items left past it time out. Thread-safe
    (one batch at a time). `close()` (or leaving a `with` block) stops the child; so does garbage
    collection and interpreter exit."""

    def __init__(
        self,
        cfg: GraderConfig,
        timeout_seconds: float,
        *,
        where: str = "task.grader",
        startup_seconds: float = STARTUP_SECONDS,
        batch_timeout_seconds: float | None = None,
        options: GraderOptions | None = None,
    ) -> None:
        # the options travel on the child's stdin, with the score model's key: never in argv
        # or the environment, where other processes of the machine could read them
        options = options or GraderOptions()
        setup = {"grader": _dump(cfg), "where": where, "options": options.to_json()}
        self.config_line = json.dumps(setup, separators=(",", ":")).encode()
        self.timeout = timeout_seconds
        self.batch_timeout = batch_timeout_seconds
        self.startup_seconds = startup_seconds
        self.load_seconds = options.python_load_seconds
        self.starts = 0  # children started so far (1 + restarts), for tests and logs
        self._lock = threading.Lock()
        self._child = _Child()
        self._finalizer = weakref.finalize(self, self._child.stop)

    def __enter__(self) -> GradingServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stops the child, with SIGKILL: it holds nothing worth a clean exit. A later `grade`
        starts a new one."""
        with self._lock:
            self._child.stop()

    def start(self) -> None:
        """Starts the child now if none runs, rather than at the next `grade`: GraderLoadError
        when a python grader's top level raised, ended the child or ran past `python_load_
        seconds` (the tenant's to fix); StartFailed for any other failure to start."""
        with self._lock:
            self._ensure_started()

    @property
    def pid(self) -> int | None:
        """The running child's pid, or None."""
        proc = self._child.proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def grade(self, items: Sequence[tuple[str, Record]]) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(items)
        pending = list(range(len(items)))
        send_failures = 0
        batch_deadline = (
            math.inf if self.batch_timeout is None else time.monotonic() + self.batch_timeout
        )
        with self._lock:
            while pending:
                if time.monotonic() >= batch_deadline:
                    self._child.stop()  # it may be inside a hung grader
                    for i in pending:
                        outcomes[i] = Outcome(
                            0.0,
                            failure="timeout",
                            message=(
                                f"the step's grading took longer than {self.batch_timeout:g} s "
                                "(task.grader_batch_timeout_seconds)"
                            ),
                        )
                    break
                try:
                    self._ensure_started()
                    sent = self._send([items[i] for i in pending])
                except (StartFailed, GraderLoadError, _Unsendable) as e:
                    for i in pending:
                        outcomes[i] = Outcome(0.0, failure="error", message=str(e))
                    break
                if not sent:
                    send_failures += 1
                    if send_failures < 2:
                        continue  # the child died between batches: once more with a new one
                    for i in pending:
                        outcomes[i] = Outcome(
                            0.0, failure="error", message="the grading server takes no input"
                        )
                    break
                self._receive(pending, outcomes, batch_deadline)
                pending = [i for i in pending if outcomes[i] is None]
        return [o for o in outcomes if o is not None]

    # -- the child ------------------------------------------------------------------------

    def _ensure_started(self) -> None:
        child = self._child
        if child.proc is not None and child.proc.poll() is None:
            return
        child.stop()
        self.starts += 1
        try:
            child.start()
        except OSError as e:  # no such interpreter, out of processes or file descriptors
            raise StartFailed(f"cannot start the grading server: {e}") from None
        deadline = time.monotonic() + self.startup_seconds
        # a child that could not take the line has died (or will): its stdout tells which
        child.write(self.config_line + b"\n", deadline)
        loading: dict[str, Any] = {}  # the python grader whose top level runs now
        while True:
            line = child.read_line(deadline)
            if not isinstance(line, bytes):
                child.stop()
                if loading:
                    raise self._load_failed(loading, line)
                why = "took too long to start" if line == "timeout" else "exited while starting"
                raise StartFailed(f"the grading server {why}{child.exit_note()}")
            reply = _decode(line)
            if "loading" not in reply:
                break
            loading = reply  # its own time from now: a tenant's code, not our imports
            deadline = time.monotonic() + self.load_seconds
        if not reply.get("ready"):
            child.stop()
            error = str(reply.get("error", "the grading server failed to start"))
            if "load_error" in reply:
                raise GraderLoadError(error, str(reply["load_error"]))
            raise StartFailed(error)

    def _load_failed(
        self, loading: dict[str, Any], line: Literal["timeout", "eof"]
    ) -> GraderLoadError:
        where, name = str(loading.get("loading")), str(loading.get("name"))
        if line == "timeout":
            why = f"did not finish loading in {self.load_seconds:g} s ({LOAD_SETTING})"
        else:
            why = f"ended the grading server while loading{self._child.exit_note()}"
        return GraderLoadError(f"{where}: python grader {name!r} {why}", where)

    def _send(self, items: Sequence[tuple[str, Record]]) -> bool:
        """Sends one batch; records shared by several items (a group of completions of one
        prompt) are sent once. False when the child does not take it."""
        index: dict[int, int] = {}
        records: list[Record] = []
        pairs: list[tuple[int, str]] = []
        for completion, record in items:
            k = index.get(id(record))
            if k is None:
                k = index[id(record)] = len(records)
                records.append(record)
            pairs.append((k, completion))
        try:
            message = json.dumps({"records": [dict(r) for r in records], "items": pairs}).encode()
        except (TypeError, ValueError) as e:  # records are parsed JSON: never expected
            raise _Unsendable(f"the records are not JSON ({e})") from None
        deadline = time.monotonic() + max(MIN_WRITE_SECONDS, self.timeout)
        if self._child.write(message + b"\n", deadline):
            return True
        self._child.stop()
        return False

    def _receive(
        self, pending: list[int], outcomes: list[Outcome | None], batch_deadline: float
    ) -> None:
        """Reads the answers to the batch of `pending`, item by item, each under the deadline;
        stops at the first item that times out or kills the child."""
        child = self._child
        for k, i in enumerate(pending):
            line = child.read_line(min(time.monotonic() + self.timeout, batch_deadline))
            if line == "timeout" and time.monotonic() >= batch_deadline:
                return  # `grade` times out this item and every one left
            if line == "timeout":
                child.stop()
                outcomes[i] = Outcome(
                    0.0,
                    failure="timeout",
                    message=f"grading took longer than {self.timeout:g} s",
                )
                return
            if line == "eof":
                child.stop()
                outcomes[i] = Outcome(
                    0.0, failure="error", message=f"the grading server died{child.exit_note()}"
                )
                return
            assert isinstance(line, bytes)
            reply = _decode(line)
            if reply.get("i") != k:  # never expected: answers come in order, one per line
                child.stop()
                outcomes[i] = Outcome(
                    0.0, failure="error", message=f"unexpected answer {line[:200]!r}"
                )
                return
            if "e" in reply or not isinstance(reply.get("v"), int | float):
                outcomes[i] = Outcome(0.0, failure="error", message=str(reply.get("e", reply)))
            else:
                outcomes[i] = Outcome(float(reply["v"]), dict(reply.get("p", {})))


class _Child:
    """One child process and the parent's buffered, deadline-bound ends of its pipes."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.buffer = b""
        self.last_exit: int | None = None

    def start(self) -> None:
        self.buffer = b""
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-c", _BOOT, _PACKAGE_ROOT, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
            env=child_environment(),
        )
        assert self.proc.stdin is not None
        os.set_blocking(self.proc.stdin.fileno(), False)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        self.last_exit = proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()

    def exit_note(self) -> str:
        proc = self.proc
        code = proc.poll() if proc is not None else self.last_exit
        if code is None:
            return ""
        if code < 0:
            return f" (killed by {signal.Signals(-code).name})"
        return f" (exit status {code})"

    def write(self, data: bytes, deadline: float) -> bool:
        assert self.proc is not None and self.proc.stdin is not None
        fd = self.proc.stdin.fileno()
        view = memoryview(data)
        while view:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if not _wait(fd, select.POLLOUT, remaining):
                continue
            try:
                view = view[os.write(fd, view) :]
            except BlockingIOError:
                continue
            except OSError:  # BrokenPipeError: the child is gone
                return False
        return True

    def read_line(self, deadline: float) -> bytes | Literal["timeout", "eof"]:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            if not _wait(fd, select.POLLIN, remaining):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self.proc.wait()
                return "eof"
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line


def child_environment() -> dict[str, str]:
    """The parent's environment less the service's settings (`PDPPO_*`: API keys, the Redis URL
    and its password, the score model's key): graders, a tenant's python included, have no use
    for them. PYTHONPATH and the rest stay (plugins are found on it)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PDPPO_")}


def _wait(fd: int, event: int, seconds: float) -> bool:
    """True when `fd` is ready for `event` (or hung up) within `seconds`. poll, not select:
    a trainer holding many files can have pipe fds past select's limit of 1024."""
    poller = select.poll()
    poller.register(fd, event)
    return bool(poller.poll(max(1, math.ceil(seconds * 1000))))


def _decode(line: bytes) -> dict[str, Any]:
    """One answer of the child; {} for anything that is not a JSON object."""
    try:
        obj = json.loads(line)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


def _dump(cfg: GraderConfig) -> Any:
    return cfg.model_dump(mode="json", by_alias=True)


# -- the child's side --------------------------------------------------------------------------


def serve(parent_pid: int) -> None:
    """The child's main loop (run by `_BOOT`): builds the grader from the first line, then
    grades batches until its stdin ends."""
    requests = os.fdopen(os.dup(0), "rb")
    answers = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # a plugin reading stdin gets EOF, not the next batch
    os.dup2(2, 1)  # a plugin printing writes to stderr, not into the answers
    # the new stdin lives as long as the process: no `with`
    sys.stdin, sys.stdout = open(os.devnull), sys.stderr  # noqa: SIM115
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # SIGKILL when the parent dies, even while a grader hangs (Linux); elsewhere the child
    # notices at its next read of stdin
    if not die_with_parent(parent_pid):
        os._exit(0)

    def answer(obj: Mapping[str, Any]) -> None:
        answers.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
        answers.flush()

    first = requests.readline()
    if not first:
        return
    try:
        from pydantic import TypeAdapter

        from core.graders.build import build_grader
        from core.graders.hosted import LOADING

        setup = json.loads(first)
        cfg: GraderConfig = TypeAdapter(GraderConfig).validate_python(setup["grader"])
        options = GraderOptions.from_json(setup.get("options"))
        LOADING.set(lambda where, name: answer({"loading": where, "name": name}))
        grader = build_grader(cfg, setup["where"], load_plugins=True, options=options)
    except GraderLoadError as e:
        answer({"ready": False, "error": str(e), "load_error": e.where})
        return
    except Exception as e:
        answer({"ready": False, "error": f"cannot build the grader: {_describe(e)}"})
        return
    answer({"ready": True})
    for line in requests:
        batch = json.loads(line)
        records = batch["records"]
        for k, (r, completion) in enumerate(batch["items"]):
            try:
                scored = grader.grade(completion, records[r])
                value = check_unit(float(scored.value), "the grader")
                answer({"i": k, "v": value, "p": scored.parts})
            except Exception as e:
                answer({"i": k, "e": _describe(e)})


def _describe(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e)[:500]}"
