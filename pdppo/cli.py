"""The `pdppo` command line: one entry point for training, serving, workers and clients.

Each subcommand lives in `pdppo.commands.<name>` and imports its heavy dependencies (torch,
FastAPI, Celery) only when run, so `pdppo --help` stays fast. Failures are reported once, here
(`pdppo.commands.errors`): a message and exit status 2 for the user's mistakes, 1 for the
server's, a traceback only with `--debug`; a reader that leaves early (`| head -1`) ends the
command quietly, with the status of a tool killed by SIGPIPE (141).
"""

import os
import select
import signal
import sys
from typing import Any, NoReturn

import click

from pdppo import __version__
from pdppo.commands import (
    dev,
    experiments,
    files,
    jobs,
    sample,
    serve,
    storage,
    train,
    webhooks,
    worker,
)

SIGPIPE_STATUS = 128 + signal.SIGPIPE
"""What a shell reports for a tool that its reader left (`pdppo status ID | head -1`)."""


def _stdout_broken() -> bool:
    """Whether stdout is a pipe whose reader has gone (Linux flags its end with POLLERR, some
    kernels with POLLHUP): a BrokenPipeError from a socket is another failure, reported as
    such. Without poll() there is no telling: stdout is the likely pipe."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # replaced, closed, or not a file
        return False
    if not hasattr(select, "poll"):
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def _reader_gone() -> NoReturn:
    """stdout's reader has closed the pipe: stop as a Unix tool killed by SIGPIPE does, without a
    word. stdout is pointed at /dev/null first, so that the interpreter's last flush of what is
    still buffered fails no more."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    raise SystemExit(SIGPIPE_STATUS)


class _Main(click.Group):
    """The top group: whatever a subcommand lets through becomes one line on stderr."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a reader gone before the last lines is seen here, not at exit
            return result
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            if isinstance(exc, BrokenPipeError) and _stdout_broken():
                _reader_gone()
            if ctx.params.get("debug"):
                raise
            from pdppo.commands.errors import explain

            raise explain(exc) from exc


@click.group(cls=_Main)
@click.version_option(__version__, prog_name="pdppo")
@click.option(
    "--debug",
    is_flag=True,
    envvar="PDPPO_DEBUG",
    help="Show the Python traceback of an error (env PDPPO_DEBUG=1).",
)
def main(debug: bool) -> None:
    """pdppo: RL fine-tuning of language models with predictive-divergence trust regions."""


main.add_command(train.train)
main.add_command(serve.serve)
main.add_command(worker.worker)
main.add_command(worker.healthcheck)
main.add_command(worker.webhook_worker)
main.add_command(worker.sample_worker)
main.add_command(dev.dev)
main.add_command(files.files)
main.add_command(webhooks.webhooks)
main.add_command(sample.sample)
for command in [*jobs.COMMANDS, *storage.COMMANDS, *experiments.COMMANDS]:
    main.add_command(command)
