"""`pdppo delete JOB_ID` and `pdppo usage`: what a tenant keeps, over the Python client."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from pdppo.commands.jobs import key_option, make_client, url_option

if TYPE_CHECKING:
    from pdppo.client.storage import Usage

_STATUSES = ("queued", "running", "paused", "succeeded", "failed", "cancelled")


@click.command()
@click.argument("job_id")
@url_option
@key_option
def delete(job_id: str, url: str, api_key: str | None) -> None:
    """Delete an ended job: its events, metrics, checkpoints and final model. Refused while it is
    queued, running or paused (cancel it first)."""
    with make_client(url, api_key) as client:
        client.delete_job(job_id)
    click.echo(f"{job_id} deleted")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the usage object as JSON.")
@url_option
@key_option
def usage(as_json: bool, url: str, api_key: str | None) -> None:
    """Show your jobs by status, your files, the bytes you keep and your storage quota."""
    with make_client(url, api_key) as client:
        found = client.usage()
    if as_json:
        click.echo(json.dumps(found.model_dump(mode="json"), indent=2))
        return
    for line in usage_lines(found):
        click.echo(line)


def usage_lines(found: Usage) -> list[str]:
    jobs = ", ".join(f"{found.jobs.get(s, 0)} {s}" for s in _STATUSES)
    used = found.bytes
    quota = (
        f"of a quota of {found.quota_bytes} ({100 * used.total / found.quota_bytes:.1f}%)"
        if found.quota_bytes
        else "(no quota)"
    )
    return [
        f"tenant {found.tenant}",
        f"jobs: {jobs}",
        f"files: {found.files}",
        f"bytes: {used.total} {quota}: {used.files} of files, {used.artifacts} of job artifacts",
    ]


COMMANDS: list[click.Command] = [delete, usage]
