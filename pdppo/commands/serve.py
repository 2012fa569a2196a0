"""`pdppo serve` (placeholder until its issue lands)."""

import click


@click.command()
def serve() -> None:
    """Not available yet."""
    raise click.ClickException("pdppo serve is not implemented yet")
