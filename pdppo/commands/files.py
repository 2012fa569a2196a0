"""`pdppo files upload|list|show|download|delete`: uploaded datasets, over the Python client.

A thin shell over `pdppo.client.Client`'s file methods (`pdppo.client.files`), with the same
`--url/--api-key` options and one-line errors as the job commands. `upload` prints the file id
(what a spec's `train.task.file` takes) on stdout, so `ID=$(pdppo files upload data.jsonl)` works.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from pdppo.commands.jobs import key_option, make_client, url_option

if TYPE_CHECKING:
    from pdppo.client.files import File


def _file_line(f: File) -> str:
    created = f.created_at.strftime("%Y-%m-%d %H:%M:%S") if f.created_at else ""
    return f"{f.id}  {f.bytes:>12}  {f.records:>8}  {f.purpose or '-':<10}  {f.filename}  {created}"


@click.group(name="files")
def files() -> None:
    """Upload JSONL datasets and manage them; a spec names one as `train.task.file: <id>`."""


@files.command()
@click.argument("path", type=click.Path(exists=True, dir_okay=False, readable=True, path_type=Path))
@click.option("--purpose", default=None, help='What it is for, e.g. "train" or "validation".')
@click.option("--json", "as_json", is_flag=True, help="Print the whole file object as JSON.")
@url_option
@key_option
def upload(path: Path, purpose: str | None, as_json: bool, url: str, api_key: str | None) -> None:
    """Upload a JSONL dataset; print its id. The server refuses it whole, naming the bad lines,
    if one line is not a valid record."""
    with make_client(url, api_key) as client:
        f = client.upload_file(path, purpose=purpose)
    if as_json:
        click.echo(json.dumps(f.model_dump(mode="json"), indent=2))
        return
    click.echo(f.id)
    already = "" if f.created else " (already uploaded: same content, same file)"
    click.echo(f"{f.records} records, {f.bytes} bytes{already}", err=True)


@files.command(name="list")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines, one file per line.")
@url_option
@key_option
def list_files(limit: int, as_json: bool, url: str, api_key: str | None) -> None:
    """List your files, newest first: id, bytes, records, purpose, name, time."""
    with make_client(url, api_key) as client:
        for f in itertools.islice(client.iter_files(page_size=min(limit, 100)), limit):
            click.echo(json.dumps(f.model_dump(mode="json")) if as_json else _file_line(f))


@files.command()
@click.argument("file_id")
@url_option
@key_option
def show(file_id: str, url: str, api_key: str | None) -> None:
    """Show one file as JSON."""
    with make_client(url, api_key) as client:
        f = client.get_file(file_id)
    click.echo(json.dumps(f.model_dump(mode="json", exclude={"created"}), indent=2))


@files.command()
@click.argument("file_id")
@click.option(
    "--output",
    "-o",
    type=click.Path(path_type=Path),
    default=None,
    help="Write to this file or folder instead of standard output.",
)
@url_option
@key_option
def download(file_id: str, output: Path | None, url: str, api_key: str | None) -> None:
    """Get a file's content, as uploaded."""
    with make_client(url, api_key) as client:
        if output is None:
            click.echo(client.file_content(file_id), nl=False)
            return
        target = client.download_file(file_id, output)
    click.echo(str(target), err=True)


@files.command()
@click.argument("file_id")
@url_option
@key_option
def delete(file_id: str, url: str, api_key: str | None) -> None:
    """Delete a file; refused while queued, running or paused jobs name it."""
    with make_client(url, api_key) as client:
        client.delete_file(file_id)
    click.echo(f"{file_id} deleted")
