"""What the commands that start long-lived processes (`pdppo serve`, `pdppo worker`) hand to
uvicorn and Celery, and the checks of their options, run by click in this process. The servers
themselves run in the stack tests (tests/integration); here their entry points are replaced by
recorders, so an option, a default or a check can be read exactly without starting one.
Found by the mutation run of the commands (bench/mutation.toml, group "commands")."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from pdppo.cli import main
from pdppo.settings import get_settings


@pytest.fixture(autouse=True)
def fresh_settings() -> Iterator[None]:
    """The commands read `get_settings()` (cached) and set PDPPO_WORKER_DEVICES and
    CUDA_VISIBLE_DEVICES in this process's environment themselves: each test starts without
    either, and the environment is put back as it was after it. (monkeypatch.delenv of a name
    that is absent records nothing to undo, so a `--gpus 2,3` here used to leave
    PDPPO_WORKER_DEVICES=2 behind, and every worker a later test of the same pytest process
    started took two-device jobs.)"""
    names = ("PDPPO_WORKER_DEVICES", "CUDA_VISIBLE_DEVICES", "PDPPO_LOG_LEVEL")
    saved = {name: os.environ.pop(name, None) for name in names}
    get_settings.cache_clear()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        get_settings.cache_clear()


def serve_call(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> dict[str, Any]:
    import uvicorn

    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: calls.append((a, k)))
    result = CliRunner().invoke(main, ["serve", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    [(positional, options)] = calls
    assert positional == ("api.app:create_app",)
    return options


def test_serve_runs_the_app_factory_with_its_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """The defaults `pdppo serve --help` promises, and 5 s for open requests (an event stream)
    to end when it is stopped: a SIGTERM from compose or `pdppo dev` must not wait on a client
    that never hangs up, nor cut a request that is about to finish."""
    options = serve_call(monkeypatch, [])
    picked = {k: options[k] for k in ("factory", "host", "port", "workers", "log_level")}
    assert picked == {
        "factory": True,
        "host": "127.0.0.1",
        "port": 8000,
        "workers": 1,
        "log_level": "info",
    }
    assert options["timeout_graceful_shutdown"] == 5
    args = ["--host", "0.0.0.0", "--port", "9001", "--workers", "3", "--log-level", "DEBUG"]
    given = serve_call(monkeypatch, args)
    assert (given["host"], given["port"], given["workers"], given["log_level"]) == (
        "0.0.0.0",
        9001,
        3,
        "debug",
    )


def worker_run(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> tuple[int, str, list[str]]:
    from workers.celery_app import celery_app

    get_settings.cache_clear()  # importing the Celery app read the settings
    argv: list[list[str]] = []
    monkeypatch.setattr(celery_app, "worker_main", lambda a: argv.append(a))
    result = CliRunner().invoke(main, ["worker", *args])
    return result.exit_code, result.output, argv[0] if argv else []


def _queues(argv: list[str]) -> str:
    return argv[argv.index("--queues") + 1]


def test_worker_gpus_name_its_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    code, out, argv = worker_run(monkeypatch, ["--queues", "gpu", "--gpus", "2,3"])
    assert code == 0, out
    assert out.splitlines()[0] == "pdppo worker: 2 device(s), queues gpu.x2,gpu"
    assert _queues(argv) == "gpu.x2,gpu"
    assert argv[argv.index("--pool") + 1] == "solo"
    assert (os.environ["CUDA_VISIBLE_DEVICES"], os.environ["PDPPO_WORKER_DEVICES"]) == ("2,3", "2")

    code, out, argv = worker_run(monkeypatch, ["--queues", "gpu", "--gpus", "0,1", "--devices=2"])
    assert (code, _queues(argv)) == (0, "gpu.x2,gpu")


def test_worker_without_gpus_keeps_the_settings_device_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    code, out, argv = worker_run(monkeypatch, [])
    assert (code, _queues(argv)) == (0, "cpu"), out
    assert out.splitlines()[0] == "pdppo worker: 1 device(s), queues cpu"
    assert "PDPPO_WORKER_DEVICES" not in os.environ
    code, out, _ = worker_run(monkeypatch, ["--devices", "2"])
    assert code == 0, out
    assert out.splitlines()[0] == "pdppo worker: 2 device(s), queues cpu.x2,cpu"


def test_worker_sends_no_event_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """Celery's event heartbeat publishes with unlimited retries from the worker's event loop: a
    worker told to stop while Redis was down never exited (the integration test is
    tests/integration/test_worker_stop_redis_down.py). Nothing in pdppo reads those events."""
    code, out, argv = worker_run(monkeypatch, [])
    assert code == 0, out
    assert argv[-3:] == ["--without-gossip", "--without-mingle", "--without-heartbeat"]


@pytest.mark.parametrize(
    ("gpus", "devices", "says"),
    [
        (",", [], "--gpus ',' names 0 GPUs, --devices None"),
        ("0,1", ["--devices", "3"], "--gpus '0,1' names 2 GPUs, --devices 3"),
    ],
)
def test_worker_refuses_gpus_that_do_not_match_its_devices(
    monkeypatch: pytest.MonkeyPatch, gpus: str, devices: list[str], says: str
) -> None:
    code, out, argv = worker_run(monkeypatch, ["--queues", "gpu", "--gpus", gpus, *devices])
    assert (code, argv) == (2, [])
    assert f"Invalid value: {says}" in out


def test_healthcheck_max_age_must_be_above_zero() -> None:
    result = CliRunner().invoke(main, ["healthcheck", "--max-age", "0"])
    assert result.exit_code == 2
    assert "Invalid value for '--max-age': 0.0 is not in the range x>0." in result.output
