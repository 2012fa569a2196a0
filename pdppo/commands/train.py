"""`pdppo train SPEC.yaml`: run a training job locally, without the service.

`--dry-run` trains nothing: it prints what the job would cost (`core.budget`) and checks it
against the limits a worker of the spec's queue applies (the `PDPPO_MAX_*` settings, read from
the environment as the service reads them), so a spec can be sized before it is submitted.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from pdppo.spec import JobSpec


def _dry_run(spec: JobSpec) -> int:
    """Print the estimate and the queue's limits; 0 if the job fits them, 1 if not."""
    from pydantic import ValidationError

    from core.budget import check, estimate, render, render_limits
    from pdppo.settings import Settings

    try:
        settings = Settings()
    except ValidationError as exc:
        raise click.ClickException(f"invalid PDPPO_* settings: {exc}") from exc
    queue = spec.resources.device
    budget = estimate(spec.train, queue=queue)
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
    "--dry-run",
    is_flag=True,
    help=(
        "Train nothing: print the job's parameters, tokens and peak memory by component, and "
        "exit 1 if they exceed the limits of its queue (PDPPO_MAX_* settings), else 0."
    ),
)
def train(spec_path: str, out_dir: str | None, resume: bool, quiet: bool, dry_run: bool) -> None:
    """Train locally from a job spec; writes metrics.jsonl, checkpoints/ and final/ into --out."""
    from pdppo.spec import SpecError, load_spec

    try:
        spec = load_spec(Path(spec_path))
    except SpecError as exc:
        raise click.ClickException(str(exc)) from exc
    if dry_run:
        raise SystemExit(_dry_run(spec))
    out = Path(out_dir) if out_dir else Path("runs") / (spec.name or Path(spec_path).stem)

    from tqdm import tqdm

    from core.trainer import TrainerCallback
    from core.trainer import train as run_training

    class Progress(TrainerCallback):
        def __init__(self) -> None:
            self.bar = tqdm(total=spec.train.steps, disable=quiet, unit="step", dynamic_ncols=True)

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

    progress = Progress()
    try:
        result = run_training(spec.train, out, callback=progress, resume=resume)
    except (ValueError, RuntimeError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        progress.bar.close()
    click.echo(f"done: step {result.step}, metrics in {out / 'metrics.jsonl'}")
    if result.final_model is not None:
        click.echo(f"final model: {result.final_model}")
