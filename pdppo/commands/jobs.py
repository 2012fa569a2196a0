"""Client subcommands: submit, status, list, cancel, set, pause, resume, logs.

They are thin shells over `pdppo.client.Client`, so the CLI and the Python client cannot drift
apart. The server URL and key come from `--url/--api-key` or `PDPPO_URL/PDPPO_API_KEY` (what
`pdppo dev` prints), never from a config file that could leak a key into a repository.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from pdppo.commands.phases import PhaseDisplay, job_phase, job_warnings

if TYPE_CHECKING:
    from tqdm import tqdm

    from pdppo.client import Client, Event, Job

# Metrics worth a place on the progress line, with short labels so that the line fits.
PREFERRED_METRICS = {
    "reward_mean": "reward",
    "masked_fraction": "masked",
    "divergence_mean": "D",
    "direction_disagreement": "disagree",
    "loss": "loss",
}
MAX_SHOWN_METRICS = 4
SHOWN_SAMPLES = 3  # triples of a `samples` event a follow prints (`/samples` has all)

url_option = click.option(
    "--url",
    envvar="PDPPO_URL",
    default="http://127.0.0.1:8000",
    show_default=True,
    help="API base URL (env PDPPO_URL).",
)
key_option = click.option(
    "--api-key",
    envvar="PDPPO_API_KEY",
    default=None,
    help="API key (env PDPPO_API_KEY).",
)


def make_client(url: str, api_key: str | None) -> Client:
    from pdppo.client import Client

    if not api_key:
        raise click.UsageError(
            "no API key: pass --api-key or set PDPPO_API_KEY (for pdppo dev: source .pdppo/dev.env)"
        )
    return Client(url, api_key)


def _job_line(job: Job) -> str:
    created = job.created_at.strftime("%Y-%m-%d %H:%M:%S") if job.created_at else ""
    progress = f"{job.progress.step}/{job.progress.total}"
    return f"{job.id}  {job.status:<10} {progress:>9}  {job.name or '':<24} {created}"


def _format_metrics(metrics: Mapping[str, Any]) -> dict[str, str]:
    """The headline metrics, short-labelled, else the first few numeric ones."""
    numeric = {
        k: v
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and k != "step"
    }
    keys = [k for k in PREFERRED_METRICS if k in numeric] or list(numeric)
    return {PREFERRED_METRICS.get(k, k): f"{numeric[k]:.3g}" for k in keys[:MAX_SHOWN_METRICS]}


def follow_job(client: Client, job_id: str, last_event_id: str | None = None) -> str:
    """Streams a job to the terminal with a live progress bar; returns its final status."""
    from tqdm import tqdm

    job = client.get(job_id)
    status = job.status
    label = job.name or job_id[:12]
    bar: tqdm[Any] = tqdm(
        total=job.progress.total or None,
        unit="step",
        desc=label,
        dynamic_ncols=True,
    )
    phases = PhaseDisplay(bar, label, tty=sys.stderr.isatty())
    warned: list[str] = []  # the stream's warnings, as printed
    try:
        for event in client.follow(job_id, last_event_id=last_event_id):
            status = _show_event(event, bar, status, phases)
            if event.event == "log" and _payload_field(event, "level") == "warning":
                warned.append(str(_payload_field(event, "message")))
            if event.event == "done":
                for line in _final_warnings(client, job_id, warned):
                    bar.write(line)
                break
    finally:
        bar.close()
    return status


def _payload_field(event: Event, name: str) -> Any:
    payload = _payload(event)
    return payload.get(name) if isinstance(payload, Mapping) else None


def _final_warnings(client: Client, job_id: str, warned: list[str]) -> list[str]:
    """The warnings the job ended with that the stream has not shown (a worker sends each as a
    `log` event too, `run finished with a warning (code): message`; the record has them once
    the job ends): after the stream, each once. A record that cannot be read now costs only
    those the stream did not show."""
    import httpx

    from pdppo.client import ApiError

    try:
        lines = job_warnings(client.get(job_id))
    except (ApiError, httpx.TransportError):
        return []
    # "warning (code): message" was shown if a warning of the stream holds "(code): message"
    return [line for line in lines if not any(line[len("warning ") :] in w for w in warned)]


def _follow_or_detach(client: Client, job_id: str, last_event_id: str | None = None) -> str:
    """Ctrl-C stops watching, not the job: say so, and how to pick the stream up again."""
    try:
        return follow_job(client, job_id, last_event_id)
    except KeyboardInterrupt:
        click.echo(
            f"\nstopped following; the job keeps running. Resume with: pdppo logs {job_id}",
            err=True,
        )
        raise SystemExit(130) from None


def _show_event(
    event: Event, bar: tqdm[Any], status: str, phases: PhaseDisplay | None = None
) -> str:
    """Draws one event: metrics move the bar, phases label it (`PhaseDisplay`), everything
    else prints a line above it."""
    payload = _payload(event)
    data: Mapping[str, Any] = payload if isinstance(payload, Mapping) else {}
    if event.event == "phase":
        name, done, total = data.get("name"), data.get("done"), data.get("total")
        if phases is not None and isinstance(name, str):
            phases.show(
                name,
                done if isinstance(done, int) else None,
                total if isinstance(total, int) else None,
            )
    elif event.event == "metrics":
        total, step = data.get("total"), data.get("step")
        if isinstance(total, int) and total > 0 and bar.total != total:
            bar.total = total
        if isinstance(step, int) and step > bar.n:
            bar.update(step - bar.n)
        metrics = data.get("metrics")
        if isinstance(metrics, Mapping):
            bar.set_postfix(_format_metrics(metrics), refresh=True)
    elif event.event in ("status", "done"):
        new = data.get("status")
        if isinstance(new, str) and new != status:
            status = new
            bar.write(f"status: {status}")
        error = data.get("error")
        if error:
            bar.write(
                f"error: {error.get('message', error) if isinstance(error, Mapping) else error}"
            )
    elif event.event == "checkpoint":
        bar.write(f"checkpoint {data.get('name', '')} (step {data.get('step', '?')})")
    elif event.event == "eval":
        bar.write(_eval_line(data))
    elif event.event == "samples":
        for line in _samples_lines(data):
            bar.write(line)
    elif event.event == "log":
        bar.write(str(data.get("message", event.data)))
    elif event.event == "config":
        changes = data.get("changes")
        pairs = changes.items() if isinstance(changes, Mapping) else ()
        shown = ", ".join(f"{k}={v}" for k, v in pairs)
        bar.write(f"config {data.get('version', '?')} after step {data.get('step', '?')}: {shown}")
    return status


def _eval_line(data: Mapping[str, Any]) -> str:
    """`eval step 20: reward 0.412  pass@4 0.6  greedy 0.5  (64 prompts)`."""
    metrics = data.get("metrics")
    metrics = metrics if isinstance(metrics, Mapping) else {}
    shown = [("eval_reward_mean", "reward")]
    shown += [(k, k.removeprefix("eval_")) for k in sorted(metrics) if k.startswith("eval_pass@")]
    shown += [("eval_greedy_reward_mean", "greedy")]
    parts = [
        f"{label} {metrics[key]:.3g}"
        for key, label in shown
        if isinstance(metrics.get(key), int | float)
    ]
    prompts = metrics.get("eval_prompts")
    count = f"  ({prompts:.0f} prompts)" if isinstance(prompts, int | float) else ""
    return f"eval step {data.get('step', '?')}: {'  '.join(parts)}{count}"


def _samples_lines(data: Mapping[str, Any]) -> list[str]:
    """A header, then one line per sample (at most SHOWN_SAMPLES): reward, prompt -> completion,
    each squeezed onto one short line."""
    samples = data.get("samples")
    samples = [s for s in samples if isinstance(s, Mapping)] if isinstance(samples, list) else []
    lines = [f"samples step {data.get('step', '?')}:"]
    for sample in samples[:SHOWN_SAMPLES]:
        reward = sample.get("reward")
        score = f"{reward:.2f}" if isinstance(reward, int | float) else "?"
        prompt = _one_line(str(sample.get("prompt", "")), 40)
        completion = _one_line(str(sample.get("completion", "")), 60)
        lines.append(f"  [{score}] {prompt} -> {completion}")
    return lines


def _one_line(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _payload(event: Event) -> Any:
    try:
        return event.json()
    except ValueError:
        return event.data


def _exit_for(status: str) -> None:
    if status != "succeeded":
        raise SystemExit(1)


LOGS_OK = ("succeeded", "cancelled")
"""How a job may end for `pdppo logs` to exit 0 once it has replayed the stream: a cancel is
how someone meant the job to end; a failure is what a script waiting on the job must see (1)."""


def _exit_for_logs(status: str | None) -> None:
    if status not in LOGS_OK:
        raise SystemExit(1)


def _done_status(event: Event) -> str | None:
    """The status a `done` event ends the job with."""
    payload = _payload(event)
    status = payload.get("status") if isinstance(payload, Mapping) else None
    return status if isinstance(status, str) else None


@click.command()
@click.argument("spec_path", metavar="SPEC.yaml", type=click.Path(exists=True, path_type=Path))
@click.option("--follow", "-f", is_flag=True, help="Stream progress and metrics until the end.")
@click.option("--idempotency-key", default=None, help="Same key, same job: safe to retry.")
@click.option(
    "--dry-run",
    is_flag=True,
    help=(
        "Submit nothing: ask the server what the job would cost and whether its queue takes it "
        "(POST /v1/jobs:validate); exit 1 if it would be refused."
    ),
)
@url_option
@key_option
def submit(
    spec_path: Path,
    follow: bool,
    idempotency_key: str | None,
    dry_run: bool,
    url: str,
    api_key: str | None,
) -> None:
    """Submit a job spec; print its id (or follow it with --follow)."""
    from pdppo.client import spec_to_dict

    if dry_run and follow:
        raise click.UsageError("--dry-run submits nothing to follow; drop --follow")
    spec = spec_to_dict(spec_path)
    with make_client(url, api_key) as client:
        if dry_run:
            _exit_for_validation(client, spec)
            return
        job = client.submit(spec, idempotency_key=idempotency_key)
        if not follow:
            click.echo(job.id)
            return
        click.echo(f"submitted {job.id}", err=True)
        status = _follow_or_detach(client, job.id)
        click.echo(f"{job.id} {status}")
        _exit_for(status)


def _exit_for_validation(client: Client, spec: dict[str, Any]) -> None:
    """Prints the server's estimate, limits and problems; exit status 1 unless it fits.

    The printing is `core.budget`'s (the same as `pdppo train --dry-run`), imported only here:
    the other client commands load no trainer code."""
    from core.budget import render, render_limits

    result = client.validate(spec)
    for line in render(result.estimate):
        click.echo(line)
    if result.limits:
        click.echo(render_limits(result.limits))
    for problem in result.problems:
        click.echo(f"refused: {problem.message}", err=True)
    if not result.ok:
        raise SystemExit(1)
    click.echo(f"the server would take it ({result.estimate.get('queue', '?')} queue)")


@click.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print the whole job object as JSON.")
@url_option
@key_option
def status(job_id: str, as_json: bool, url: str, api_key: str | None) -> None:
    """Show one job's status."""
    with make_client(url, api_key) as client:
        job = client.get(job_id)
    if as_json:
        click.echo(json.dumps(job.model_dump(mode="json"), indent=2))
    else:
        for line in status_lines(job):
            click.echo(line)


def status_lines(job: Job) -> list[str]:
    """`pdppo status`: the job line, its latest metrics, what it is doing (`phase: warm-up
    12/65`) while it runs, its error, and the warnings it ended with."""
    lines = [_job_line(job)]
    if job.metrics:
        lines.append("  " + "  ".join(f"{k}={v}" for k, v in _format_metrics(job.metrics).items()))
    phase = job_phase(job)
    if phase is not None:
        lines.append(f"phase: {phase}")
    if job.error is not None:
        lines.append(f"error ({job.error.code}): {job.error.message}")
    return lines + job_warnings(job)


@click.command(name="list")
@click.option(
    "--status",
    "status_filter",
    type=click.Choice(["queued", "running", "paused", "succeeded", "failed", "cancelled"]),
    default=None,
    help="Only jobs in this state.",
)
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 1000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines, one job per line.")
@url_option
@key_option
def list_jobs(
    status_filter: str | None, limit: int, as_json: bool, url: str, api_key: str | None
) -> None:
    """List your jobs, newest first."""
    with make_client(url, api_key) as client:
        jobs = _take(client.iter_jobs(status=status_filter, page_size=min(limit, 100)), limit)
    for job in jobs:
        click.echo(json.dumps(job.model_dump(mode="json")) if as_json else _job_line(job))


def _take(jobs: Iterator[Job], n: int) -> list[Job]:
    out: list[Job] = []
    for job in jobs:
        if len(out) >= n:
            break
        out.append(job)
    return out


@click.command()
@click.argument("job_id")
@url_option
@key_option
def cancel(job_id: str, url: str, api_key: str | None) -> None:
    """Cancel a job: a running one stops at its next step."""
    with make_client(url, api_key) as client:
        job = client.cancel(job_id)
    click.echo(cancel_line(job))


def cancel_line(job: Job) -> str:
    """What a cancel did: a queued or paused job is cancelled at once; a running one only got
    the request (its status still says running), so say when it stops rather than `running`."""
    if job.done or not job.cancel_requested:
        return f"{job.id} {job.status}"
    return (
        f"{job.id} cancel requested: the {job.status} job stops within seconds, keeping its "
        f"checkpoints (pdppo status {job.id} says cancelled once it has)"
    )


@click.command(name="set")
@click.argument("job_id")
@click.argument("settings", nargs=-1, required=True)
@url_option
@key_option
def set_settings(job_id: str, settings: tuple[str, ...], url: str, api_key: str | None) -> None:
    """Change a running job's settings: KEY=VALUE pairs, e.g. `optim.lr=1e-4
    algorithm.delta_high=0.2 steps=200` (paths inside `train`; values read as YAML). The job
    applies them at its next step."""
    with make_client(url, api_key) as client:
        job = client.change(job_id, settings_patch(settings))
    click.echo(f"{job.id} {job.status} config_version={job.config_version}")


def settings_patch(pairs: tuple[str, ...]) -> dict[str, Any]:
    """KEY=VALUE pairs as a merge patch of the spec: `optim.lr=1e-4` is
    {"train": {"optim": {"lr": 0.0001}}} (a leading `train.` may be given too)."""
    from pdppo.client import spec_yaml_load

    patch: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r}: expected KEY=VALUE", param_hint="SETTINGS")
        node = patch.setdefault("train", {})
        parts = key.removeprefix("train.").split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = spec_yaml_load(text)
    return patch


@click.command()
@click.argument("job_id")
@url_option
@key_option
def pause(job_id: str, url: str, api_key: str | None) -> None:
    """Pause a job: a running one checkpoints and releases its worker."""
    with make_client(url, api_key) as client:
        job = client.pause(job_id)
    click.echo(
        f"{job.id} pausing: it stops at the next step boundary (or warm-up step), checkpoints "
        f"there and frees its worker; `pdppo resume {job.id}` continues from there"
        if job.pause_requested
        else f"{job.id} {job.status}"
    )


@click.command()
@click.argument("job_id")
@url_option
@key_option
def resume(job_id: str, url: str, api_key: str | None) -> None:
    """Resume a paused job (or one failed for its disk) from its checkpoint."""
    with make_client(url, api_key) as client:
        job = client.resume(job_id)
    click.echo(f"{job.id} {job.status}")


@click.command()
@click.argument("job_id")
@click.option("--raw", is_flag=True, help="Print every event as `id event data` lines.")
@click.option("--since", default=None, help="Resume after this event id.")
@url_option
@key_option
def logs(job_id: str, raw: bool, since: str | None, url: str, api_key: str | None) -> None:
    """Stream a job's events from the start (or --since) until it ends; exit 1 if it failed."""
    with make_client(url, api_key) as client:
        if not raw:
            final = _follow_or_detach(client, job_id, last_event_id=since)
            click.echo(f"{job_id} {final}")
            _exit_for_logs(final)
            return
        ended = None
        for event in client.follow(job_id, last_event_id=since):
            click.echo(f"{event.id or '-'} {event.event} {event.data}")
            sys.stdout.flush()
            if event.event == "done":
                ended = _done_status(event)
    _exit_for_logs(ended)


COMMANDS: list[click.Command] = [
    submit,
    status,
    list_jobs,
    cancel,
    set_settings,
    pause,
    resume,
    logs,
]
