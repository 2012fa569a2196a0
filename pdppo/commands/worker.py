"""`pdppo worker`: a Celery worker that runs training jobs, one at a time per process."""

from __future__ import annotations

import os
import socket

import click


@click.command()
@click.option(
    "--queues",
    default="cpu",
    show_default=True,
    help="Comma-separated queues to take jobs from: gpu, cpu or gpu,cpu.",
)
@click.option("--loglevel", default=None, help="Celery log level (default: PDPPO_LOG_LEVEL).")
@click.option("--name", default=None, help="Worker node name (default: pdppo-<host>-<pid>).")
def worker(queues: str, loglevel: str | None, name: str | None) -> None:
    """Run jobs from the queues. One job at a time, in this process (`-P solo`): CUDA is never
    forked, and a GPU worker owns its GPU (start one per GPU, with CUDA_VISIBLE_DEVICES)."""
    from pdppo.settings import get_settings
    from workers.celery_app import QUEUES

    settings = get_settings()
    chosen = [q.strip() for q in queues.split(",") if q.strip()]
    unknown = sorted(set(chosen) - set(QUEUES))
    if not chosen or unknown:
        raise click.BadParameter(f"unknown queues {unknown}; choose from {list(QUEUES)}")
    from workers.celery_app import celery_app

    node = name or f"pdppo-{'-'.join(chosen)}@{socket.gethostname()}-{os.getpid()}"
    celery_app.worker_main(
        [
            "worker",
            "--queues",
            ",".join(chosen),
            "--pool",
            "solo",
            "--hostname",
            node,
            "--loglevel",
            (loglevel or settings.log_level).upper(),
            "--without-gossip",
            "--without-mingle",
        ]
    )
