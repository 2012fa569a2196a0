"""A real MLflow server for the tracker tests (the `mlflow_server` fixture of tests/conftest.py):
`mlflow server` on a SQLite backend, started once per module on a free port and killed after.

The server needs the full `mlflow` package (Flask, SQLAlchemy, ...), which a worker does not: the
`mlflow` extra is the client alone (`mlflow-skinny`). So the server may come from another
virtualenv: `PDPPO_TEST_MLFLOW_SERVER` names its `mlflow` executable (CI makes one, .ci/run);
otherwise the `mlflow` beside this interpreter, if it can serve. Without one (README's test
command on a developer's machine, CI's main run), the tests that need it are deselected, not
skipped: CI's trackers step (.ci/trackers) runs every one of them with its own server."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.stack import free_port


def mlflow_server_command() -> str | None:
    named = os.environ.get("PDPPO_TEST_MLFLOW_SERVER")
    if named:
        return named
    beside = Path(sys.executable).parent / "mlflow"
    for candidate in (str(beside), shutil.which("mlflow")):
        if candidate and Path(candidate).exists():
            python = Path(candidate).parent / "python"  # the server imports Flask
            probe = subprocess.run(
                [str(python), "-c", "import mlflow.server"],
                capture_output=True,
                timeout=60,
                check=False,
            )
            if probe.returncode == 0:
                return candidate
    return None


@dataclass
class MlflowServer:
    url: str
    proc: subprocess.Popen[bytes]
    root: Path

    def stop(self) -> None:
        """Kill its process group (the server runs uvicorn workers under it)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def start_mlflow(root: Path, timeout: float = 90) -> MlflowServer:
    command = mlflow_server_command()
    if command is None:
        pytest.skip("no MLflow server: set PDPPO_TEST_MLFLOW_SERVER to an `mlflow` executable")
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = (root / "mlflow.log").open("ab")
    proc = subprocess.Popen(
        [
            command,
            "server",
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        cwd=root,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = MlflowServer(f"http://127.0.0.1:{port}", proc, root)
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"mlflow server did not start: {(root / 'mlflow.log').read_text()}")
        time.sleep(0.2)
