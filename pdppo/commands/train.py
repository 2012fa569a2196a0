"""`pdppo train SPEC.yaml`: run a training job locally, without the service.

`--dry-run` trains nothing: it prints what the job would cost (`core.budget`) and checks it
against the limits a worker of the spec's queue applies (the `PDPPO_MAX_*` settings, read from
the environment as the service reads them), so a spec can be sized before it is submitted.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from pdppo.commands.errors import DEBUG_HINT, UserError, debugging, explain
from pdppo.extras import WORKER_MODULES, need_extra

if TYPE_CHECKING:
    from pdppo.spec import JobSpec


def _dry_run(spec: JobSpec) -> int:
    """Print the estimate and the queue's limits; 0 if the job fits them, 1 if not."""
    from core.budget import check, estimate, render, render_limits
    from pdppo.settings import Settings

    settings = Settings()  # a bad PDPPO_* setting is reported by pdppo.commands.errors
    queue = spec.resources.device
    budget = estimate(spec.train, queue=queue, devices=spec.resources.gpus)
    limits = settings.budget_limits(queue)
    for line in render(budget.to_dict()):
        click.echo(line)
    click.echo(render_limits(asdict(limits)))
    problems = check(budget, limits)
    for problem in problems:
        click.echo(f"over budget: {problem}", err=True)
    if problems:
        return 1
    click.echo(f"fits the {queue} queue's limits")
    return 0


@click.command()
@click.argument("spec_path", metavar="SPEC.yaml", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Output directory (default: runs/<spec name or file stem>).",
)
@click.option("--resume", is_flag=True, help="Continue from the latest checkpoint in --out.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option(
    "--nproc",
    type=click.IntRange(1, 64),
    default=None,
    help=(
        "Data-parallel processes on this machine (torch.distributed: gloo on CPU, nccl on "
        "GPUs, one per device); each trains on its share of every step's groups, which "
        "rollout.prompts_per_step must split evenly. Default: the spec's resources.gpus."
    ),
)
@click.option(
    "--dry-run",
    is_flag=True,
    help=(
        "Train nothing: print the job's parameters, tokens and peak memory by component, and "
        "exit 1 if they exceed the limits of its queue (PDPPO_MAX_* settings), else 0."
    ),
)
def train(
    spec_path: str,
    out_dir: str | None,
    resume: bool,
    quiet: bool,
    nproc: int | None,
    dry_run: bool,
) -> None:
    """Train locally from a job spec; writes metrics.jsonl, checkpoints/ and final/ into --out."""
    # --dry-run reads the settings (pydantic-settings) but loads no model
    need_extra("pdppo train", "worker", ("pydantic_settings",) if dry_run else WORKER_MODULES)
    from pdppo.spec import SpecError, load_spec

    try:
        spec = load_spec(Path(spec_path))
    except SpecError as exc:
        raise UserError(str(exc)) from exc
    _check_task_values(spec)
    if dry_run:
        raise SystemExit(_dry_run(spec))
    out = Path(out_dir) if out_dir else Path("runs") / (spec.name or Path(spec_path).stem)

    from core.parallel.distributed import World, check_world

    nproc = nproc or spec.resources.gpus  # a spec of N devices runs as N processes here too
    try:
        check_world(spec.train, World(0, nproc))
        threads = _threads(nproc)
        if nproc > 1:
            click.echo(f"training on {nproc} processes")
            result = _data_parallel(
                spec.train.model_dump_json(), out, resume, quiet=quiet, nproc=nproc, threads=threads
            )
        else:
            result = _train(spec.train.model_dump_json(), out, resume, quiet)
    except (ValueError, RuntimeError, OSError, ImportError) as exc:
        if debugging():
            raise  # the traceback; a rank's failure holds the rank's own
        raise _failure(exc) from exc
    click.echo(f"done: step {result.step}, metrics in {out / 'metrics.jsonl'}")
    if result.final_model is not None:
        click.echo(f"final model: {result.final_model}")


def _check_task_values(spec: JobSpec) -> None:
    """A reasoning-gym dataset's config values, as its config class judges them, before any
    model loads (the schema checked the names: `core.tasks.reasoning_gym.check_values`)."""
    if spec.train.task.name != "reasoning_gym":
        return
    from core.tasks.reasoning_gym import check_values

    try:
        check_values(spec.train.task)
    except (ValueError, ImportError) as exc:
        raise UserError(str(exc)) from exc


class RankFailed(RuntimeError):
    """A rank of a data-parallel run raised or died; the message is what torch reports, the
    rank's traceback included."""


def _failure(exc: Exception) -> click.ClickException:
    """What a failed run says: a validation error every field of it (a bad PDPPO_* setting),
    a rank's failure the last line of its traceback (what went wrong), anything else its whole
    message (an ImportError: a feature's extra is missing, core.extras.MissingExtra)."""
    from pydantic import ValidationError  # here: `pdppo --help` loads no pydantic

    if isinstance(exc, ValidationError):
        return explain(exc)
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, RankFailed):
        return click.ClickException(f"{text.splitlines()[-1]}; {DEBUG_HINT} of the rank")
    return click.ClickException(text)


def _threads(nproc: int) -> int | None:
    """Each process's share of this process's cores (`core.process.threads`), set here for this one
    (the ranks set it themselves) and said before training starts. One process keeps torch's
    default (every core), unless PDPPO_JOB_THREADS says otherwise: None."""
    import torch

    from core.process.threads import asked_threads, own_cores, share_cores

    job_threads = _env_int("PDPPO_JOB_THREADS")
    if nproc == 1 and job_threads is None:
        return None
    asked, setting = asked_threads(job_threads, "PDPPO_JOB_THREADS")
    share = share_cores(own_cores(), None, nproc, asked, setting)
    torch.set_num_threads(share.threads)
    click.echo(share.describe())
    return share.threads


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise UserError(f"{name}={raw!r}: give a whole number of threads, 1 or more")
    return int(raw)


def _train(config_json: str, out: Path, resume: bool, quiet: bool, world: Any = None) -> Any:
    """One process's run (rank 0's or the only one's shows the progress bar)."""
    from core.config import TrainConfig
    from core.training.trainer import TrainerCallback
    from core.training.trainer import train as run_training
    from pdppo.settings import Settings

    config = TrainConfig.model_validate_json(config_json)
    shown = world is None or world.rank == 0
    progress: Any = _progress(config.steps, quiet) if shown else TrainerCallback()
    # the operator's trackers and addresses (PDPPO_REPORT_TO, PDPPO_MLFLOW_TRACKING_URI, ...)
    tracking = Settings().tracking_options(run_name=Path(out).resolve().name, tags={})
    try:
        return run_training(
            config, out, callback=progress, resume=resume, world=world, tracking=tracking
        )
    finally:
        if shown:
            progress.bar.close()


def _data_parallel(
    config_json: str, out: Path, resume: bool, quiet: bool, nproc: int, threads: int | None
) -> Any:
    """`nproc` processes on this machine, rendezvous on a free local port; rank 0's result."""
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    from core.parallel.distributed import free_port

    port = free_port()
    queue = mp.get_context("spawn").SimpleQueue()
    try:
        mp.spawn(
            _rank_main,
            args=(nproc, port, config_json, out, resume, quiet, queue, os.getpid(), threads),
            nprocs=nproc,
        )
    except ProcessException as exc:  # a rank raised or died: the others were stopped
        raise RankFailed(str(exc)) from exc
    return queue.get()


def _rank_main(
    rank: int,
    nproc: int,
    port: int,
    config_json: str,
    out: Path,
    resume: bool,
    quiet: bool,
    queue: Any,
    parent: int,
    threads: int | None,
) -> None:
    import torch
    import torch.distributed as dist

    if threads is not None:
        torch.set_num_threads(threads)  # a spawned process starts with torch's default

    from core.parallel.distributed import World, join_group, leave_group
    from core.process.parent_death import die_with_parent

    # torch's spawn arms SIGINT, which a rank blocked in a collective never acts on: the
    # fresh-clone CI of a81de89 saw both ranks of a killed `pdppo train` outlive it
    if not die_with_parent(parent):
        os._exit(1)
    join_group(rank, nproc, port, cuda=torch.cuda.is_available())
    try:
        result = _train(config_json, out, resume, quiet, World(rank, nproc))
        if rank == 0:
            queue.put(result)
        # every rank done before any leaves: a group torn down under a rank still in it made
        # gloo abort that rank ("terminate called without an active exception", SIGABRT)
        dist.barrier()
    finally:
        leave_group()


def _progress(total: int, quiet: bool) -> Any:
    """The progress bar of `pdppo train`, as a TrainerCallback (`.bar` to close)."""
    from tqdm import tqdm

    from core.training.trainer import TrainerCallback
    from pdppo.commands.phases import PhaseDisplay

    class Progress(TrainerCallback):
        def __init__(self) -> None:
            self.bar = tqdm(total=total, disable=quiet, unit="step", dynamic_ncols=True)
            # quiet: no bar, so a phase gets the lines a log gets
            self.phases = PhaseDisplay(self, "", tty=not quiet and sys.stderr.isatty())

        def write(self, s: str) -> None:
            self.on_log(s)

        def set_description_str(self, desc: str | None = None, refresh: bool = True) -> None:
            self.bar.set_description_str(desc, refresh=refresh)

        def on_phase(self, name: str, done: int | None = None, total: int | None = None) -> None:
            """Loading the model, warm-up 12/65, evaluating: the bar says what the run does
            while no step is counted (`pdppo.commands.phases`)."""
            self.phases.show(name, done, total)

        def on_step(self, step: int, metrics: dict[str, float]) -> None:
            self.bar.n = step
            self.bar.set_postfix(
                reward=f"{metrics['reward_mean']:.3f}",
                masked=f"{metrics['masked_fraction']:.3f}",
                loss=f"{metrics['loss']:.3f}",
                refresh=False,
            )
            self.bar.update(0)

        def on_log(self, message: str) -> None:
            if quiet:
                click.echo(message)
            else:
                self.bar.write(message)

    return Progress()
