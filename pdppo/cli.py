"""The `pdppo` command line: one entry point for training, serving, workers and clients.

Each subcommand lives in `pdppo.commands.<name>` and imports its heavy dependencies (torch,
FastAPI, Celery) only when run, so `pdppo --help` stays fast.
"""

import click

from pdppo import __version__
from pdppo.commands import dev, files, jobs, serve, train, worker


@click.group()
@click.version_option(__version__, prog_name="pdppo")
def main() -> None:
    """pdppo: RL fine-tuning of language models with predictive-divergence trust regions."""


main.add_command(train.train)
main.add_command(serve.serve)
main.add_command(worker.worker)
main.add_command(worker.healthcheck)
main.add_command(dev.dev)
main.add_command(files.files)
for command in jobs.COMMANDS:
    main.add_command(command)
