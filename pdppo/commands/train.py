"""`pdppo train SPEC.yaml`: run a training job locally, without the service."""

from __future__ import annotations

from pathlib import Path

import click


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
def train(spec_path: str, out_dir: str | None, resume: bool, quiet: bool) -> None:
    """Train locally from a job spec; writes metrics.jsonl, checkpoints/ and final/ into --out."""
    from pdppo.spec import SpecError, load_spec

    try:
        spec = load_spec(Path(spec_path))
    except SpecError as exc:
        raise click.ClickException(str(exc)) from exc
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
