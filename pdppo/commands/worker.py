"""`pdppo worker` (training jobs, one at a time per process), `pdppo healthcheck`, and the
workers of the side queues: `pdppo webhook-worker` and `pdppo sample-worker`."""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

import click

from pdppo.extras import WORKER_MODULES, need_extra

if TYPE_CHECKING:
    from celery import Celery


@click.command()
@click.option(
    "--queues",
    default="cpu",
    show_default=True,
    help="Comma-separated queues to take jobs from: gpu, cpu or gpu,cpu.",
)
@click.option(
    "--gpus",
    default=None,
    metavar="0,1,...",
    help=(
        "The GPUs this worker owns (CUDA_VISIBLE_DEVICES is set to them); it takes jobs of up "
        "to that many devices. Default: whatever CUDA_VISIBLE_DEVICES already shows."
    ),
)
@click.option(
    "--devices",
    type=click.IntRange(1, 64),
    default=None,
    help=(
        "Devices this worker owns, when --gpus does not say (a CPU worker's data-parallel "
        "processes). Default: PDPPO_WORKER_DEVICES, else 1."
    ),
)
@click.option("--loglevel", default=None, help="Celery log level (default: PDPPO_LOG_LEVEL).")
@click.option("--name", default=None, help="Worker node name (default: pdppo-<host>-<pid>).")
def worker(
    queues: str, gpus: str | None, devices: int | None, loglevel: str | None, name: str | None
) -> None:
    """Run jobs from the queues. One job at a time, in this process (`-P solo`): CUDA is never
    forked. A job owns every device of its worker: start one worker per GPU for one-GPU jobs, or
    one worker with --gpus 0,1,2,3 for jobs of up to 4 (resources.gpus)."""
    need_extra("pdppo worker", "worker", WORKER_MODULES)
    from pdppo.queues import DEVICES, worker_queues

    chosen = [q.strip() for q in queues.split(",") if q.strip()]
    unknown = sorted(set(chosen) - set(DEVICES))
    if not chosen or unknown:
        raise click.BadParameter(f"unknown queues {unknown}; choose from {list(DEVICES)}")
    if gpus is not None:
        ids = [g.strip() for g in gpus.split(",") if g.strip()]
        if not ids or (devices is not None and devices != len(ids)):
            raise click.BadParameter(f"--gpus {gpus!r} names {len(ids)} GPUs, --devices {devices}")
        # before anything imports torch: the job processes see exactly these, as cuda:0..N-1
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
        devices = len(ids)
    if devices is not None:
        os.environ["PDPPO_WORKER_DEVICES"] = str(devices)
    from pdppo.settings import get_settings

    settings = get_settings()
    taken = worker_queues(chosen, settings.worker_devices)  # type: ignore[arg-type]
    from workers.celery_app import celery_app

    node = name or f"pdppo-{'-'.join(chosen)}@{socket.gethostname()}-{os.getpid()}"
    click.echo(f"pdppo worker: {settings.worker_devices} device(s), queues {','.join(taken)}")
    celery_app.worker_main(
        [
            "worker",
            "--queues",
            ",".join(taken),
            "--pool",
            "solo",
            "--hostname",
            node,
            "--loglevel",
            (loglevel or settings.log_level).upper(),
            "--without-gossip",
            "--without-mingle",
            # Celery's event heartbeat publishes from the event loop with unlimited retries: told
            # to stop while Redis was down, a worker never exited (it retried, deaf to SIGTERM).
            # Nothing reads those events; Flower lists workers by them, but a worker busy with a
            # job sends none anyway (the solo pool holds the loop). Health: `pdppo healthcheck`.
            "--without-heartbeat",
        ]
    )


@click.command()
@click.option(
    "--max-age",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds since a worker last reached Redis before it counts as dead "
    "(default: PDPPO_WORKER_HEALTH_MAX_AGE_SECONDS).",
)
def healthcheck(max_age: float | None) -> None:
    """Exit 0 when every worker process on this machine (this container) reached Redis
    recently, 1 otherwise: the worker containers' healthcheck. Reads the files the workers'
    reaper threads write (PDPPO_WORKER_HEARTBEAT_DIR); talks to nothing itself."""
    need_extra("pdppo healthcheck", "worker", ("pydantic_settings",))
    from pdppo.settings import get_settings
    from workers.upkeep.heartbeat import read_beats, verdict

    settings = get_settings()
    limit = settings.worker_health_max_age_seconds if max_age is None else max_age
    healthy, message = verdict(read_beats(settings.worker_heartbeat_dir), limit)
    click.echo(message)
    raise SystemExit(0 if healthy else 1)


def _threads_worker(app: Celery, queue: str, threads: int, node: str, loglevel: str) -> None:
    """A worker of one side queue (webhooks, completions): a pool of threads, for work that
    waits on the network or holds the GIL briefly, beside the training workers' solo pool."""
    app.worker_main(
        [
            "worker",
            "--queues",
            queue,
            "--pool",
            "threads",
            "--concurrency",
            str(threads),
            "--hostname",
            node,
            "--loglevel",
            loglevel.upper(),
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
    )


@click.command("webhook-worker")
@click.option(
    "--concurrency",
    type=click.IntRange(1, 256),
    default=None,
    help="Deliveries at once (default: PDPPO_WEBHOOK_CONCURRENCY).",
)
@click.option("--loglevel", default=None, help="Celery log level (default: PDPPO_LOG_LEVEL).")
@click.option(
    "--name", default=None, help="Worker node name (default: pdppo-webhooks-<host>-<pid>)."
)
def webhook_worker(concurrency: int | None, loglevel: str | None, name: str | None) -> None:
    """Deliver webhooks: route job events to the tenants' endpoints and send them, signed, with
    retries for over a day. Needs no GPU and no trainer; run one or two per deployment (several
    share the work)."""
    need_extra("pdppo webhook-worker", "worker", ("celery", "pydantic_settings", "httpx"))
    from pdppo.settings import get_settings
    from workers.webhooks import QUEUE, webhook_app

    settings = get_settings()
    threads = concurrency or settings.webhook_concurrency
    node = name or f"pdppo-webhooks@{socket.gethostname()}-{os.getpid()}"
    click.echo(f"pdppo webhook-worker: {threads} deliveries at once, queue {QUEUE}")
    _threads_worker(webhook_app, QUEUE, threads, node, loglevel or settings.log_level)


@click.command("sample-worker")
@click.option(
    "--concurrency",
    type=click.IntRange(1, 64),
    default=None,
    help="Completions at once (default: PDPPO_SAMPLE_CONCURRENCY).",
)
@click.option("--loglevel", default=None, help="Celery log level (default: PDPPO_LOG_LEVEL).")
@click.option("--name", default=None, help="Worker node name (default: pdppo-sample@<host>-<pid>).")
def sample_worker(concurrency: int | None, loglevel: str | None, name: str | None) -> None:
    """Answer completion requests (`POST /v1/jobs/{id}/completions`, `/v1/chat/completions`)
    with succeeded jobs' final models, on CPU, from queue `sample` only: training jobs never wait
    for it, nor it for them. Needs the artifact store the API and the training workers share."""
    need_extra("pdppo sample-worker", "worker", ("celery", "pydantic_settings", "torch"))
    import workers.sampling  # noqa: F401  (registers the task)
    from pdppo.settings import get_settings
    from workers.sample_app import QUEUE, sample_app

    settings = get_settings()
    threads = concurrency or settings.sample_concurrency
    node = name or f"pdppo-sample@{socket.gethostname()}-{os.getpid()}"
    click.echo(f"pdppo sample-worker: {threads} completions at once, queue {QUEUE}")
    _threads_worker(sample_app, QUEUE, threads, node, loglevel or settings.log_level)
