"""Every `pdppo` command, given each kind of bad input that applies to it, answers with one
message and exit status 2 (1 for a server's 5xx), never a Python traceback.

The commands are enumerated from the click group and the bad inputs chosen from their parameters
(a spec file, `--url`, `--api-key`, a job or file id), so a new command is tried without a line
here; one whose arguments this file cannot fill fails `test_every_command_is_tried` until it is
taught. Each case is a real `pdppo` process against the real stack (redis, API, worker), a port
nobody listens on, or a gateway that answers 502 (`tests/client/proxy.BadGateway`).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
import yaml

from pdppo.cli import main
from tests.client.proxy import BadGateway
from tests.support.specs import smoke_spec
from tests.support.stack import KEYS, Service, free_port, pdppo_command

TENANT = "carol"
UNKNOWN_JOB = "job-doesnotexist"
UNKNOWN_FILE = "file-" + "0" * 32
BAD_YAML = "name: broken\ntrain: [\n  steps: 3\n"
# A valid YAML mapping the API refuses (422): steps must be positive.
REFUSED_SPEC = smoke_spec(steps=-1)
BAD_JSONL = '{"prompt": 5}\n'
GOOD_JSONL = '{"prompt": "12=", "answer": "21"}\n'
# Commands that read PDPPO_* settings and talk to no API: their bad input is a bad setting.
SETTINGS_COMMANDS = {
    ("serve",),
    ("worker",),
    ("healthcheck",),
    ("webhook-worker",),
    ("sample-worker",),
}
UNKNOWN_WEBHOOK = "wh_" + "0" * 24
UNKNOWN_EXPERIMENT = "0" * 24
UNKNOWN_DELIVERY = "msg_" + "0" * 32
PUBLIC_URL = "https://93.184.216.34/hook"  # an address literal: no DNS
REFUSED_URL = "https://10.0.0.1/hook"  # a private address: the API's 400
# Flags without which a command would not read the file under test.
EXTRA_ARGS: dict[tuple[str, ...], list[str]] = {
    ("dev",): ["--demo", "--once", "--port", "0"],
    ("experiment",): ["--grid", "algorithm.mask=predictive,dppo", "--seeds", "2"],
}


def _commands(
    group: click.Group, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from _commands(command, (*prefix, name))
        else:
            yield (*prefix, name), command


COMMANDS = dict(_commands(main))


def _options(command: click.Command) -> set[str]:
    return {p.name for p in command.params if isinstance(p, click.Option) and p.name}


def _file_params(command: click.Command) -> list[click.Parameter]:
    """The parameters naming a file that must exist (a spec, a dataset)."""
    return [
        p for p in command.params if isinstance(p.type, click.Path) and p.type.exists and p.name
    ]


def _kinds(path: tuple[str, ...], command: click.Command) -> list[str]:
    kinds = []
    files = _file_params(command)
    if any("spec" in (p.name or "") for p in files):
        kinds.append("bad_yaml")
    if files:
        kinds.append("missing_file")
    if "url" in _options(command):
        kinds += ["unreachable", "server_error"]
        args = {p.name for p in command.params if isinstance(p, click.Argument)}
        named = {"job_id", "file_id", "spec_path", "path", "webhook_id", "endpoint_url"}
        if args & (named | {"experiment_id"}):
            kinds.append("client_error")
    if "api_key" in _options(command):
        kinds.append("wrong_key")
    if path in SETTINGS_COMMANDS:
        kinds.append("bad_setting")
    return kinds


CASES = [(path, kind) for path, command in COMMANDS.items() for kind in _kinds(path, command)]


@dataclass(frozen=True)
class Files:
    spec: Path
    jsonl: Path
    bad_yaml: Path
    refused_spec: Path
    bad_jsonl: Path
    missing: Path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    root = tmp_path_factory.mktemp("cli-errors")
    made = Files(
        spec=root / "good.yaml",
        jsonl=root / "good.jsonl",
        bad_yaml=root / "bad.yaml",
        refused_spec=root / "refused.yaml",
        bad_jsonl=root / "bad.jsonl",
        missing=root / "missing.yaml",
    )
    made.spec.write_text(yaml.safe_dump(smoke_spec(steps=2)))
    made.jsonl.write_text(GOOD_JSONL)
    made.bad_yaml.write_text(BAD_YAML)
    made.refused_spec.write_text(yaml.safe_dump(REFUSED_SPEC))
    made.bad_jsonl.write_text(BAD_JSONL)
    return made


@pytest.fixture(scope="module")
def gateway() -> Iterator[BadGateway]:
    server = BadGateway()
    yield server
    server.close()


def _args(path: tuple[str, ...], command: click.Command, kind: str, files: Files) -> list[str]:
    """The command line of one case: every required argument filled for that kind."""
    args = [*path, *EXTRA_ARGS.get(path, [])]
    for param in command.params:
        spec_like = "spec" in (param.name or "")
        value: Path | str
        if kind == "missing_file" and param in _file_params(command):
            value = files.missing
        elif kind == "bad_yaml" and param in _file_params(command) and spec_like:
            value = files.bad_yaml
        elif not isinstance(param, click.Argument):
            continue
        elif param.name == "job_id":
            value = UNKNOWN_JOB
        elif param.name == "file_id":
            value = UNKNOWN_FILE
        elif param.name == "spec_path":
            value = files.refused_spec if kind == "client_error" else files.spec
        elif param.name == "path":
            value = files.bad_jsonl if kind == "client_error" else files.jsonl
        elif param.name == "webhook_id":
            value = UNKNOWN_WEBHOOK
        elif param.name == "experiment_id":
            value = UNKNOWN_EXPERIMENT
        elif param.name == "delivery_id":
            value = UNKNOWN_DELIVERY
        elif param.name == "endpoint_url":
            value = REFUSED_URL if kind == "client_error" else PUBLIC_URL
        elif param.name == "prompt":
            value = "12="
        elif param.name == "settings":
            value = "optim.lr=0.001"
        else:
            raise AssertionError(f"teach {__name__} a value for {param.name} of {path}")
        if isinstance(param, click.Argument):
            args.append(str(value))
        else:
            args += [param.opts[0], str(value)]
    return args


# What each kind must make the command say (on stderr), and its exit status.
EXPECTED = {
    "bad_yaml": (2, "not valid YAML"),
    "missing_file": (2, "does not exist"),
    "unreachable": (2, "cannot reach"),
    "server_error": (1, "HTTP 502"),
    "client_error": (2, "(HTTP 4"),
    "wrong_key": (2, "invalid API key"),
    "bad_setting": (2, "PDPPO_ENVIRONMENT"),
}


def test_every_command_is_tried() -> None:
    untried = [" ".join(path) for path, command in COMMANDS.items() if not _kinds(path, command)]
    assert not untried, f"no bad input chosen for: {untried}"
    assert {("submit",), ("files", "upload"), ("dev",), ("train",)} <= set(COMMANDS)
    assert {("experiment",), ("experiments", "report"), ("experiments", "delete")} <= set(COMMANDS)
    for path, command in COMMANDS.items():
        for kind in _kinds(path, command):
            _args(path, command, kind, Files(*(Path("x"),) * 6))  # every argument fillable


@pytest.mark.parametrize(("path", "kind"), CASES, ids=[f"{' '.join(p)}-{k}" for p, k in CASES])
def test_bad_input_gives_a_message_not_a_traceback(
    path: tuple[str, ...],
    kind: str,
    files: Files,
    service: Service,
    gateway: BadGateway,
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PDPPO_")}
    env |= {
        "PDPPO_URL": service.base_url,
        "PDPPO_API_KEY": KEYS[TENANT],
    }
    if kind == "unreachable":
        env["PDPPO_URL"] = f"http://127.0.0.1:{free_port()}"
    elif kind == "server_error":
        env["PDPPO_URL"] = gateway.url
    elif kind == "wrong_key":
        env["PDPPO_API_KEY"] = "wrong-key-0123456789"
    elif kind == "bad_setting":
        env["PDPPO_ENVIRONMENT"] = "bogus"
    args = _args(path, COMMANDS[path], kind, files)
    if path == ("dev",):
        args += ["--data-dir", str(tmp_path / "dev")]
    done = subprocess.run(
        [*pdppo_command(), *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    code, needle = EXPECTED[kind]
    shown = f"$ pdppo {' '.join(args)}\nexit {done.returncode}\n{done.stdout}{done.stderr}"
    assert "Traceback" not in done.stdout + done.stderr, shown
    assert done.returncode == code, shown
    assert needle in done.stderr, shown


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    """`--debug` or PDPPO_DEBUG=1: the original exception, traceback and all, for a bug report."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PDPPO_")}
    env |= {"PDPPO_URL": f"http://127.0.0.1:{free_port()}", "PDPPO_API_KEY": KEYS[TENANT]}
    for flags, extra in (["--debug"], {}), ([], {"PDPPO_DEBUG": "1"}):
        done = subprocess.run(
            [*pdppo_command(), *flags, "status", UNKNOWN_JOB],
            env=env | extra,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1, done.stderr
        assert "Traceback" in done.stderr and "httpx.ConnectError" in done.stderr, done.stderr


def test_raw_logs_from_a_closed_port_say_cannot_reach_at_once(tmp_path: Path) -> None:
    """`logs --raw` goes straight to the event stream (no job read first, as plain `logs`
    does): a refused first connection must read like every other command's, not like a stream
    lost after a minute and a half of reconnects."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PDPPO_")}
    env |= {"PDPPO_URL": f"http://127.0.0.1:{free_port()}", "PDPPO_API_KEY": KEYS[TENANT]}
    started = time.monotonic()
    done = subprocess.run(
        [*pdppo_command(), "logs", "--raw", UNKNOWN_JOB],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - started
    code, needle = EXPECTED["unreachable"]
    assert (done.returncode, needle in done.stderr) == (code, True), done.stderr
    assert "lost the job's event stream" not in done.stderr
    assert took < 20, f"took {took:.1f}s"  # one refused connection; it was 88 s of reconnects


def test_raw_logs_from_a_gateway_answering_502_say_so_at_once(
    gateway: BadGateway, tmp_path: Path
) -> None:
    """A gateway whose API is down answers 502: `logs --raw` says so with the URL and the status,
    as `pdppo status` does. It retried for 88 s, then said "lost the job's event stream"."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PDPPO_")}
    env |= {"PDPPO_URL": gateway.url, "PDPPO_API_KEY": KEYS[TENANT]}
    started = time.monotonic()
    done = subprocess.run(
        [*pdppo_command(), "logs", "--raw", UNKNOWN_JOB],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - started
    code, needle = EXPECTED["server_error"]
    assert (done.returncode, needle in done.stderr) == (code, True), done.stderr
    assert f"from GET {gateway.url}/v1/jobs/{UNKNOWN_JOB}/events" in done.stderr, done.stderr
    assert "lost the job's event stream" not in done.stderr
    assert took < 20, f"took {took:.1f}s"  # one answer; it was 88 s of reconnects
