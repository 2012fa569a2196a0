"""The `pdppo` command line: one entry point for training, serving, workers and clients.

Each subcommand lives in `pdppo.commands.<name>` and imports its heavy dependencies (torch,
FastAPI, Celery) only when run, so `pdppo --help` stays fast. Failures are reported once, here
(`pdppo.commands.errors`): a message and exit status 2 for the user's mistakes, 1 for the
server's, a traceback only with `--debug`.
"""

from typing import Any

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


class _Main(click.Group):
    """The top group: whatever a subcommand lets through becomes one line on stderr."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
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
