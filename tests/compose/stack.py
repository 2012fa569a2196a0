"""The compose stack under test, driven from the host: the compose CLI for the containers, the
published API port for everything a user does.

`.ci/compose` brings the stack up and hands it over in environment variables; a developer can
point the tests at a stack of their own the same way (see `Stack.from_env`).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "deploy" / "docker-compose.yml"
TERMINAL = {"succeeded", "failed", "cancelled"}


def default_services() -> tuple[str, ...]:
    """What a plain `up` starts: every service the compose file puts in no profile."""
    services = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    return tuple(name for name, service in services.items() if "profiles" not in service)


@dataclass(frozen=True)
class Stack:
    project: str  # compose project name (-p)
    env_file: Path  # the .env the stack was brought up with
    url: str  # the API as the host sees it
    keys: dict[str, str]  # tenant -> API key
    data_dir: Path  # the host folder the workers mount read-only at /data
    compose: tuple[str, ...]  # `docker-compose` (1.29) or `docker compose` (v2)

    @classmethod
    def from_env(cls) -> Stack:
        keys = dict(
            pair.split(":", 1) for pair in os.environ["PDPPO_COMPOSE_API_KEYS"].split(",") if pair
        )
        return cls(
            project=os.environ["PDPPO_COMPOSE_PROJECT"],
            env_file=Path(os.environ["PDPPO_COMPOSE_ENV_FILE"]),
            url=os.environ["PDPPO_COMPOSE_URL"],
            keys=keys,
            data_dir=Path(os.environ["PDPPO_COMPOSE_DATA_DIR"]),
            compose=tuple(shlex.split(os.environ.get("PDPPO_COMPOSE_CMD", "docker-compose"))),
        )

    def run(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """One compose command on this project; its output is in the error when it fails."""
        command = [
            *self.compose,
            "--project-name",
            self.project,
            "--env-file",
            str(self.env_file),
            "--file",
            str(COMPOSE_FILE),
            *args,
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(
                f"{shlex.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
            )
        return done

    def container(self, service: str) -> str:
        """The service's container, stopped ones too (Compose v2's `ps` lists running ones only
        unless told `--all`; 1.29's listed both)."""
        ids = self.run("ps", "--all", "-q", service).stdout.split()
        assert len(ids) == 1, f"{service}: containers {ids}"
        return ids[0]

    def inspect(self, service: str) -> dict[str, Any]:
        out = docker("inspect", self.container(service))
        found: list[dict[str, Any]] = json.loads(out)
        return found[0]

    def health(self, service: str) -> str:
        state = self.inspect(service)["State"]
        return str(state["Health"]["Status"]) if "Health" in state else "none"

    def wait_healthy(self, *services: str, timeout: float = 180) -> None:
        """Until each service (default: every one a plain `up` starts) reports healthy."""
        deadline = time.monotonic() + timeout
        pending = list(services or default_services())
        while pending:
            pending = [s for s in pending if self.health(s) != "healthy"]
            if pending and time.monotonic() > deadline:
                logs = self.run("logs", "--tail", "40", *pending, check=False).stdout
                raise AssertionError(f"not healthy after {timeout:.0f}s: {pending}\n{logs}")
            if pending:
                time.sleep(1)

    def exec(self, service: str, *command: str, check: bool = True) -> str:
        """Run `command` in the service's container (as its own user) and return its output."""
        done = self.run("exec", "-T", service, *command, check=check)
        return done.stdout + done.stderr

    def client(self, tenant: str = "alice", timeout: float = 30) -> httpx.Client:
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.keys[tenant]}"},
            timeout=timeout,
        )

    def cli(self, *args: str, tenant: str = "alice", timeout: float = 300) -> str:
        """The `pdppo` command line of the host's virtualenv, talking to the stack."""
        env = {**os.environ, "PDPPO_URL": self.url, "PDPPO_API_KEY": self.keys[tenant]}
        done = subprocess.run(
            ["pdppo", *args], capture_output=True, text=True, timeout=timeout, env=env
        )
        assert done.returncode == 0, f"pdppo {shlex.join(args)}: {done.stdout}\n{done.stderr}"
        return done.stdout


def docker(*args: str, timeout: float = 60) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"docker {shlex.join(args)}: {done.stderr}"
    return done.stdout


def wait_job(
    client: httpx.Client,
    job_id: str,
    done: Any = lambda job: job["status"] in TERMINAL,
    timeout: float = 240,
) -> dict[str, Any]:
    """Poll the job until `done(job)`; rides out the API being away (a restart under test)."""
    deadline = time.monotonic() + timeout
    job: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            response = client.get(f"/v1/jobs/{job_id}")
            if response.status_code == 200:
                job = response.json()
                if done(job):
                    return job
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} not done after {timeout:.0f}s: {job}")


def wait_api(client: httpx.Client, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if client.get("/readyz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the API was not ready after {timeout:.0f}s")
