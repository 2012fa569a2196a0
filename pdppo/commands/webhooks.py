"""`pdppo webhooks create|list|show|delete|deliveries|redeliver|test`: a tenant's webhook
endpoints and their delivery log, over the Python client (`pdppo.client.webhooks`).

`create` is the one place the endpoint's secret is ever shown (the server keeps no way to show it
again), so it prints it labelled, with a line on stderr saying so. The event types are checked by
the server, not here: it owns the list, and a newer server's types must not need a newer CLI.
"""

from __future__ import annotations

import itertools
import json
from typing import TYPE_CHECKING

import click

from pdppo.commands.jobs import key_option, make_client, url_option

if TYPE_CHECKING:
    from datetime import datetime

    from pdppo.client.webhooks import Webhook, WebhookDelivery

SECRET_HINT = (
    "store the secret now: it verifies every delivery's webhook-signature and is not shown again"
)
LAST_WIDTH = 40  # characters of a delivery's last error in the `deliveries` table
DELIVERY_COLUMNS = (
    ("ID", 36),
    ("TYPE", 25),
    ("STATUS", 9),
    ("ATTEMPTS", 8),
    ("LAST", LAST_WIDTH),
    ("NEXT ATTEMPT", 0),
)


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else "-"


def created_lines(hook: Webhook) -> list[str]:
    """What `create` prints on stdout: the endpoint, then its secret, each labelled."""
    return [
        f"id      {hook.id}",
        f"url     {hook.url}",
        f"events  {', '.join(hook.events)}",
        f"secret  {hook.secret}",
    ]


def webhook_line(hook: Webhook) -> str:
    return f"{hook.id}  {hook.url}  {','.join(hook.events)}  {hook.description}".rstrip()


def _last(delivery: WebhookDelivery) -> str:
    """The last attempt's outcome in one cell: its error, else the receiver's status."""
    if delivery.last_error:
        flat = " ".join(delivery.last_error.split())
        return flat if len(flat) <= LAST_WIDTH else flat[: LAST_WIDTH - 1] + "…"
    if delivery.last_status_code is not None:
        return f"HTTP {delivery.last_status_code}"
    return "-"


def _row(cells: list[str]) -> str:
    padded = [cell.ljust(width) for cell, (_, width) in zip(cells, DELIVERY_COLUMNS, strict=True)]
    return "  ".join(padded).rstrip()


def delivery_lines(deliveries: list[WebhookDelivery]) -> list[str]:
    """The `deliveries` table: a header, then one row per delivery."""
    rows = [_row([name for name, _ in DELIVERY_COLUMNS])]
    for d in deliveries:
        due = _when(d.next_attempt_at) if d.status == "pending" else "-"
        rows.append(_row([d.id, d.type, d.status, str(d.attempts), _last(d), due]))
    return rows


@click.group(name="webhooks")
def webhooks() -> None:
    """Endpoints that receive your jobs' events, signed per Standard Webhooks, and their
    delivery log."""


@webhooks.command()
@click.argument("endpoint_url", metavar="URL")
@click.option(
    "--event",
    "events",
    multiple=True,
    metavar="TYPE",
    help="An event type to receive, e.g. job.succeeded or fine_tuning.job.failed (repeatable; "
    "default: job.succeeded, job.failed, job.cancelled).",
)
@click.option("--description", default="", help="A note for yourself (at most 200 characters).")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the endpoint, secret included, as JSON."
)
@url_option
@key_option
def create(
    endpoint_url: str,
    events: tuple[str, ...],
    description: str,
    as_json: bool,
    url: str,
    api_key: str | None,
) -> None:
    """Register URL (https; a public address unless the operator allows its network) for your
    jobs' events; print its id and its secret, shown this once."""
    with make_client(url, api_key) as client:
        hook = client.create_webhook(endpoint_url, events or None, description)
    if as_json:
        click.echo(json.dumps(hook.model_dump(mode="json"), indent=2))
    else:
        for line in created_lines(hook):
            click.echo(line)
    click.echo(SECRET_HINT, err=True)


@webhooks.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines, one endpoint per line.")
@url_option
@key_option
def list_webhooks(as_json: bool, url: str, api_key: str | None) -> None:
    """List your endpoints, oldest first: id, URL, events, description."""
    with make_client(url, api_key) as client:
        hooks = client.list_webhooks()
    for hook in hooks:
        click.echo(json.dumps(hook.model_dump(mode="json")) if as_json else webhook_line(hook))
    if not hooks and not as_json:
        click.echo("no webhooks (pdppo webhooks create URL registers one)", err=True)


@webhooks.command()
@click.argument("webhook_id")
@url_option
@key_option
def show(webhook_id: str, url: str, api_key: str | None) -> None:
    """Show one endpoint as JSON (without its secret)."""
    with make_client(url, api_key) as client:
        hook = client.get_webhook(webhook_id)
    click.echo(json.dumps(hook.model_dump(mode="json", exclude={"secret"}), indent=2))


@webhooks.command()
@click.argument("webhook_id")
@url_option
@key_option
def delete(webhook_id: str, url: str, api_key: str | None) -> None:
    """Delete an endpoint; its pending deliveries are dropped, not sent."""
    with make_client(url, api_key) as client:
        client.delete_webhook(webhook_id)
    click.echo(f"{webhook_id} deleted")


@webhooks.command()
@click.argument("webhook_id")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 1000))
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines, one delivery per line.")
@url_option
@key_option
def deliveries(webhook_id: str, limit: int, as_json: bool, url: str, api_key: str | None) -> None:
    """The endpoint's deliveries, newest first: id, event type, status, attempts, the last
    attempt's outcome and when a pending one is tried next."""
    with make_client(url, api_key) as client:
        walk = client.iter_webhook_deliveries(webhook_id, page_size=min(limit, 100))
        found = list(itertools.islice(walk, limit))
    if as_json:
        for d in found:
            click.echo(json.dumps(d.model_dump(mode="json")))
        return
    for line in delivery_lines(found):
        click.echo(line)


@webhooks.command()
@click.argument("webhook_id")
@click.argument("delivery_id")
@url_option
@key_option
def redeliver(webhook_id: str, delivery_id: str, url: str, api_key: str | None) -> None:
    """Send a delivery again now, with a fresh round of retries (same webhook-id, so a
    receiver that has it already can ignore it)."""
    with make_client(url, api_key) as client:
        d = client.redeliver(webhook_id, delivery_id)
    click.echo(f"{d.id} {d.status}: sent again now (pdppo webhooks deliveries {webhook_id})")


@webhooks.command(name="test")
@click.argument("webhook_id")
@url_option
@key_option
def test_webhook(webhook_id: str, url: str, api_key: str | None) -> None:
    """Send a webhook.test event now, to check the receiver and its signature check."""
    with make_client(url, api_key) as client:
        d = client.test_webhook(webhook_id)
    click.echo(f"{d.id} {d.type} {d.status}: sent now (pdppo webhooks deliveries {webhook_id})")
