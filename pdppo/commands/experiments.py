"""`pdppo experiment SPEC --grid PATH=V1,V2 --seeds N [--follow]` and
`pdppo experiments list|show|report|cancel|pause|resume|delete`: experiments over the Python
client (`pdppo.client.experiments`).

Grid values are read as YAML scalars (`0.2` a number, `true` a boolean, `null` none, anything
else a string), so that `--grid algorithm.delta_high=0.1,0.2` sends numbers, as a spec file would.
Following polls the experiment: a line per arm on stderr whenever its children's statuses change
or its steps pass another quarter of the total, then the report table on stdout and
`<id> <status>` as the last line (exit 1 unless every child succeeded).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from pdppo.commands.jobs import key_option, make_client, url_option

if TYPE_CHECKING:
    from pdppo.client import Client
    from pdppo.client.experiments import Experiment, ExperimentArm

POLL_SECONDS = 1.0


def parse_grid(items: tuple[str, ...]) -> dict[str, list[Any]]:
    """`PATH=V1,V2,...` options as the grid; a usage error for one without `=` or values."""
    import yaml

    grid: dict[str, list[Any]] = {}
    for item in items:
        path, sep, values = item.partition("=")
        if not sep or not path.strip() or not values.strip():
            raise click.UsageError(f"--grid {item!r}: write PATH=VALUE,VALUE,...")
        grid[path.strip()] = [yaml.safe_load(v.strip()) for v in values.split(",")]
    return grid


def arm_line(arm: ExperimentArm) -> str:
    """One arm's progress: children by status and steps done of all its children's steps."""
    counts: dict[str, int] = {}
    for run in arm.runs:
        counts[run.status] = counts.get(run.status, 0) + 1
    done = sum(run.progress.get("step", 0) for run in arm.runs)
    total = sum(run.progress.get("total", 0) for run in arm.runs)
    states = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    return f"{arm.name}: {states}; steps {done}/{total}"


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report_lines(report: dict[str, Any]) -> list[str]:
    """The report as a table: final value (median [min, max]), steps to threshold, masked
    fraction, and against the baseline the mean paired difference, its 95% interval and the
    sign test."""
    rows = [["ARM", f"FINAL {report['metric']}", "REACHED", "MASKED", "VS BASELINE", "SIGN"]]
    for arm in report["arms"]:
        final = arm["final"]
        reached = arm["steps_to_threshold"]
        versus = arm["vs_baseline"]
        if versus is None:
            diff, sign = "(baseline)", ""
        else:
            ci = versus["ci95"] or [None, None]
            diff = f"{_num(versus['mean_diff'], 3)} [{_num(ci[0])}, {_num(ci[1])}]"
            test = versus["sign_test"]
            sign = f"{test['wins']}-{test['losses']}-{test['ties']} p={_num(test['p_value'])}"
        rows.append(
            [
                arm["name"],
                f"{_num(final['median'])} [{_num(final['min'])}, {_num(final['max'])}]",
                f"{reached['reached']}/{reached['of']}" if report["threshold"] is not None else "-",
                _num(arm["masked_fraction"]["mean"]),
                diff,
                sign,
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    seeds = ", ".join(str(s) for s in report["paired_seeds"])
    lines.append(f"paired seeds: {seeds or 'none'}; baseline {report['baseline']}")
    for arm in report["arms"]:  # why a comparison says nothing (p=-), when the report knows
        if arm["vs_baseline"] and arm["vs_baseline"].get("note"):
            lines.append(f"{arm['name']}: {arm['vs_baseline']['note']}")
    return lines


def _progress_key(arm: ExperimentArm) -> tuple[tuple[tuple[str, int], ...], int]:
    """What must change for an arm's line to be printed again: its children's statuses, or its
    steps passing another quarter of the total (not every step: a line per poll of a long run
    would bury the others)."""
    counts: dict[str, int] = {}
    for run in arm.runs:
        counts[run.status] = counts.get(run.status, 0) + 1
    done = sum(run.progress.get("step", 0) for run in arm.runs)
    total = sum(run.progress.get("total", 0) for run in arm.runs)
    return tuple(sorted(counts.items())), (4 * done // total if total else 0)


def follow_experiment(client: Client, experiment_id: str) -> Experiment:
    """Polls until every child has ended, printing an arm's line when it has moved on."""
    shown: dict[str, tuple[tuple[tuple[str, int], ...], int]] = {}
    while True:
        exp = client.get_experiment(experiment_id)
        for arm in exp.arms:
            key = _progress_key(arm)
            if shown.get(arm.name) != key:
                click.echo(arm_line(arm), err=True)
                shown[arm.name] = key
        if exp.ended:
            return exp
        time.sleep(POLL_SECONDS)


def _print_report(client: Client, experiment_id: str, **params: Any) -> None:
    for line in report_lines(client.experiment_report(experiment_id, **params)):
        click.echo(line)


@click.command()
@click.argument("spec_path", metavar="SPEC.yaml", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--grid",
    "grid_items",
    multiple=True,
    required=True,
    help="PATH=V1,V2,...: a spec path under train and its values (repeat for more axes).",
)
@click.option("--seeds", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--baseline", default=None, help="The arm compared with (default: the first).")
@click.option("--name", default=None, help="The experiment's name (children: NAME/ARM/seedS).")
@click.option("--follow", "-f", is_flag=True, help="Show progress, then the report.")
@click.option("--idempotency-key", default=None, help="Same key, same experiment: safe to retry.")
@url_option
@key_option
def experiment(
    spec_path: Path,
    grid_items: tuple[str, ...],
    seeds: int,
    baseline: str | None,
    name: str | None,
    follow: bool,
    idempotency_key: str | None,
    url: str,
    api_key: str | None,
) -> None:
    """Run the job spec SPEC once per arm of the grid and seed; print the experiment id (or
    follow it to its report with --follow)."""
    from pdppo.client import spec_to_dict

    body: dict[str, Any] = {
        "base": spec_to_dict(spec_path),
        "grid": parse_grid(grid_items),
        "seeds": seeds,
    }
    if baseline is not None:
        body["baseline"] = baseline
    if name is not None:
        body["name"] = name
    with make_client(url, api_key) as client:
        exp = client.create_experiment(body, idempotency_key=idempotency_key)
        if not follow:
            click.echo(exp.id)
            return
        click.echo(f"submitted {exp.id}: {len(exp.arms)} arms x {seeds} seeds", err=True)
        done = follow_experiment(client, exp.id)
        _print_report(client, exp.id)
    click.echo(f"{exp.id} {done.status}")
    if done.status != "succeeded":
        raise SystemExit(1)


@click.group()
def experiments() -> None:
    """List, inspect, report on and act on experiments."""


@experiments.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@url_option
@key_option
def list_(as_json: bool, url: str, api_key: str | None) -> None:
    """Your experiments, newest first."""
    with make_client(url, api_key) as client:
        for exp in client.iter_experiments():
            if as_json:
                click.echo(json.dumps(exp.model_dump(mode="json")))
            else:
                children = sum(exp.counts.values())
                click.echo(
                    f"{exp.id}  {exp.status:9}  {children:3} jobs  {exp.name or ''}".rstrip()
                )


@experiments.command()
@click.argument("experiment_id")
@click.option("--json", "as_json", is_flag=True, help="Print the whole experiment as JSON.")
@url_option
@key_option
def show(experiment_id: str, as_json: bool, url: str, api_key: str | None) -> None:
    """One experiment: each arm's children and their progress."""
    with make_client(url, api_key) as client:
        exp = client.get_experiment(experiment_id)
    if as_json:
        click.echo(json.dumps(exp.model_dump(mode="json"), indent=2))
        return
    click.echo(f"{exp.id} {exp.status} {exp.name or ''}".rstrip())
    for arm in exp.arms:
        click.echo(arm_line(arm))
        for run in arm.runs:
            step = f"{run.progress.get('step', 0)}/{run.progress.get('total', 0)}"
            click.echo(f"  seed {run.seed}: {run.job_id} {run.status} {step}")


@experiments.command()
@click.argument("experiment_id")
@click.option("--metric", default="reward_mean", show_default=True)
@click.option("--baseline", default=None, help="An arm name (default: the experiment's).")
@click.option("--threshold", type=float, default=None, help="Count steps to reach it.")
@click.option("--final-fraction", type=click.FloatRange(0, 1, min_open=True), default=None)
@click.option("--csv", "as_csv", is_flag=True, help="Print the report as CSV.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@url_option
@key_option
def report(
    experiment_id: str,
    metric: str,
    baseline: str | None,
    threshold: float | None,
    final_fraction: float | None,
    as_csv: bool,
    as_json: bool,
    url: str,
    api_key: str | None,
) -> None:
    """Each arm against the baseline: paired per-seed differences, bootstrap 95% interval, exact
    sign test, steps to a threshold, masked fraction."""
    params: dict[str, Any] = {
        "metric": metric,
        "baseline": baseline,
        "threshold": threshold,
        "final_fraction": final_fraction,
    }
    with make_client(url, api_key) as client:
        if as_csv:
            click.echo(client.experiment_report_csv(experiment_id, **params), nl=False)
        elif as_json:
            click.echo(json.dumps(client.experiment_report(experiment_id, **params), indent=2))
        else:
            _print_report(client, experiment_id, **params)


def _action(name: str, doc: str) -> click.Command:
    @click.command(name, help=doc)
    @click.argument("experiment_id")
    @url_option
    @key_option
    def act(experiment_id: str, url: str, api_key: str | None) -> None:
        with make_client(url, api_key) as client:
            exp = getattr(client, f"{name}_experiment")(experiment_id)
        click.echo(f"{exp.id} {exp.status}")

    return act


experiments.add_command(_action("cancel", "Cancel every child not ended yet."))
experiments.add_command(_action("pause", "Pause every queued or running child."))
experiments.add_command(_action("resume", "Queue every paused child again."))


@experiments.command()
@click.argument("experiment_id")
@url_option
@key_option
def delete(experiment_id: str, url: str, api_key: str | None) -> None:
    """Delete an experiment and all its child jobs, once every child has ended."""
    with make_client(url, api_key) as client:
        client.delete_experiment(experiment_id)
    click.echo(f"{experiment_id} deleted")


COMMANDS: list[click.Command] = [experiment, experiments]
